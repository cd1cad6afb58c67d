"""Median and worst averaging iteration per method, from a `dssync compare` report's steps.csv.

A method with local steps averages only every ``every``-th step, so its median iteration is a
step without communication; its tail is read over the steps that average (step % every == 0),
after 3 warm-up steps, over every seed. ``every`` is read from the method's label
(``dssync-topo-local:every=16``) or its preset (for ``auto``, the preset it picked, from summary.json beside the CSV).

    .venv/bin/python tools/step_tails.py reports/ttt-s4-dynamic/steps.csv
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from dssync.lab.methods import OPTIONS, get_method, split_label

WARMUP = 3


def every_of(label: str) -> int:
    name, own = split_label(label)
    method = get_method(name)
    return int(own.get("every") or method.options.get("every") or OPTIONS["every"])


def main(path: str) -> int:
    summary = json.loads((Path(path).parent / "summary.json").read_text())
    ran = {m: (s.get("auto") or [m])[0] for m, s in summary["methods"].items()}  # auto: its pick
    steps: dict[str, list[float]] = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            step, every = int(row["step"]), every_of(ran.get(row["method"], row["method"]))
            if step > WARMUP and step % every == 0:
                steps[row["method"]].append(float(row["iter_s"]))
    print("| method | averaging steps | median, ms | worst, ms | worst / median |")
    print("|---|---|---|---|---|")
    for method, times in steps.items():
        med = statistics.median(times)
        print(
            f"| {method} | {len(times)} | {med * 1000:.0f} | {max(times) * 1000:.0f} "
            f"| {max(times) / med:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
