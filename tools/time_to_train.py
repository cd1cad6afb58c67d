"""Race methods to the workload's target on emulated clusters; keep each result for the docs.

For each scenario it runs one ``dssync compare --cluster SCENARIO`` (every method and seed in one
run, on the same cluster) and copies its ``summary.json`` and time plot to
``docs/results/<name>.json`` / ``.png``; then ``tools/results_page.py`` renders the page. Needs
root and iproute2.

    sudo .venv/bin/python tools/time_to_train.py --scenario s2-inter-rack --seeds 5 \\
        --methods bsp,fp16,local-sgd,powersgd,dssync-topo,dssync-topo-overlap,auto

With ``--workload lm`` the results go to ``docs/results/lm-races/<scenario>.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
WORKLOADS = {  # what each race trains: mnist's wide MLP (the README's first races) or the lm
    "mnist": ["--workload", "mnist", "--workload-option", "hidden=2048"],
    "lm": ["--workload", "lm"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", action="append", required=True)
    ap.add_argument("--methods", required=True)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="mnist")
    ap.add_argument("--name", default=None, help="result name (default: the scenario's)")
    ap.add_argument("--title", default=None, help="heading on the docs page")
    ap.add_argument("extra", nargs="*", help="more `dssync compare` options, after --")
    a = ap.parse_args(argv)
    dssync = str(Path(sys.executable).with_name("dssync"))
    for scenario in a.scenario:
        name = a.name or (scenario if a.workload == "mnist" else f"{a.workload}-races/{scenario}")
        out = ROOT / "reports" / f"ttt-{name.replace('/', '-')}"
        cmd = [
            dssync, "compare", "--cluster", scenario, *WORKLOADS[a.workload], "--seeds", str(a.seeds),
            "--methods", a.methods, "--quiet", "--out", str(out), *a.extra,
        ]  # fmt: skip
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, timeout=4 * 3600)
        summary = json.loads((out / "summary.json").read_text())
        kind = "" if a.workload == "mnist" else f", {a.workload}"
        summary["meta"]["title"] = a.title or f"{scenario}{kind}, 8 workers"
        (RESULTS / f"{name}.json").parent.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
        shutil.copy(out / "metric_vs_time.png", RESULTS / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
