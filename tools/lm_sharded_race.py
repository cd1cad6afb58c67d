"""Time-to-target race on an emulated cluster: FSDP2's HSDP against DS-Sync across replicas on the
sharded `lm` workload, one replica per rack (issue 46, item 3's race). Needs root and iproute2.

The runs are :mod:`dssync.lab.bench.sharded_race`'s (its docstring says what each setting and
each timing is). The target, unless ``--target`` is given, is fixed by a rule read from the HSDP
runs alone: the largest validation loss HSDP shows at ``--target-at`` (75%) of its steps over the
seeds, rounded up to 0.01, so HSDP reaches it on every seed before its end.

    sudo PYTHONPATH=src .venv/bin/python tools/lm_sharded_race.py --spec s5-sharded \\
        --steps 240 --seeds 0 1 2 --out docs/results/lm/sharded-race.json
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys

from dssync.lab.bench.sharded_race import SETTINGS, race
from dssync.lab.cli.output import provenance
from dssync.lab.cluster import load_cluster


def pick_target(rows: list[dict], at: float) -> float:
    """The largest HSDP loss at fraction ``at`` of the run over the seeds, up to 0.01."""
    worst = 0.0
    for r in rows:
        if r["setting"] == "hsdp":
            step = at * r["steps"]
            point = next(p for p in r["curve"] if p["step"] >= step)
            worst = max(worst, point["loss"])
    return math.ceil(worst * 100) / 100


def reached(row: dict, target: float) -> dict | None:
    """The first evaluation at or below ``target`` (None if the run never got there)."""
    return next((p for p in row["curve"] if p["loss"] <= target), None)


def markdown(rows: list[dict], target: float) -> str:
    """Time to the target per seed, median and range, steps there, steps/s, final loss."""
    seeds = sorted({r["seed"] for r in rows})
    head = " | ".join(f"seed {s}, s" for s in seeds)
    lines = [
        f"| setting | {head} | median (range), s | steps to target | steps/s | final loss |",
        "|" + "---|" * (len(seeds) + 5),
    ]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = {r["seed"]: r for r in rows if r["setting"] == setting}
        hits = {s: reached(r, target) for s, r in mine.items()}
        cells = [f"{hits[s]['train_s']:.1f}" if hits.get(s) else "n/a" for s in seeds]
        times = [h["train_s"] for h in hits.values() if h]
        spread = (
            f"{statistics.median(times):.1f} ({min(times):.1f}-{max(times):.1f})"
            if len(times) == len(mine)
            else f"{len(times)}/{len(mine)} reached"
        )
        steps = ", ".join(str(h["step"]) if h else "n/a" for h in hits.values())
        rate = statistics.median(r["steps"] / r["curve"][-1]["train_s"] for r in mine.values())
        final = statistics.median(r["curve"][-1]["loss"] for r in mine.values())
        lines.append(
            f"| {setting} | " + " | ".join(cells) + f" | {spread} | {steps} | {rate:.2f} | "
            f"{final:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="s5-sharded", help="cluster spec: shipped name or file")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--eval-windows", type=int, default=512)
    ap.add_argument("--target", type=float, default=None, help="validation loss to reach")
    ap.add_argument("--target-at", type=float, default=0.75, help="see the module docstring")
    ap.add_argument("--out", default=None, help="result file (JSON) to write")
    ap.add_argument("--show", default=None, help="print a result file's table and exit")
    a = ap.parse_args()
    if a.show:
        with open(a.show) as f:
            run = json.load(f)["runs"][-1]
        target = a.target if a.target is not None else run["target"]
        print(f"target: validation loss {target}\n{markdown(run['rows'], target)}")
        return
    spec = load_cluster(a.spec)
    rows = race(spec, a.settings, a.seeds, a.steps, a.eval_every, a.eval_windows)
    target = a.target if a.target is not None else pick_target(rows, a.target_at)
    table = markdown(rows, target)
    print(f"target: validation loss {target}\n{table}")
    if a.out:
        meta = provenance()
        meta["command"] = shlex.join(["python", "tools/lm_sharded_race.py", *sys.argv[1:]])
        meta.update(
            spec=a.spec, ranks=spec.world_size, shards=spec.hosts_per_rack * spec.workers_per_host
        )
        meta.update(target=target, target_rule=None if a.target else f"hsdp at {a.target_at}")
        with open(a.out, "w") as f:
            json.dump({"runs": [{**meta, "rows": rows, "table": table}]}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
