"""Where an emulated cluster run's wall time goes: start, imports, the worker, the exit.

Runs one method of ``dssync compare``'s default run on a scenario of the emulated cluster (root
and iproute2), with each rank timing itself, and prints per rank the seconds from the launch to
the interpreter's start, the imports, the training call (data, model, training, evaluations)
and from its end to the launcher's return; ``--profile`` also keeps rank 0's cProfile stats.

    sudo .venv/bin/python tools/run_cost.py --scenario s2-inter-rack --method dssync-topo-local
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

WORKER = """
import json, os, sys, time
t0 = time.time()
from dssync.lab.config import TrainConfig
from dssync.lab.train.run import run_training
t1 = time.time()
cfg = TrainConfig(**json.load(open(sys.argv[1])))
rank = int(os.environ.get("RANK", 0))
profile = None
if rank == 0 and sys.argv[3] == "1":
    import cProfile
    profile = cProfile.Profile()
    profile.enable()
run_training(cfg)
t2 = time.time()
if profile is not None:
    profile.disable()
    profile.dump_stats(os.path.join(sys.argv[2], "rank0.prof"))
with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
    json.dump({"start": t0, "imported": t1, "trained": t2, "end": time.time()}, f)
from dssync.lab.launch import exit_quietly
exit_quietly(0)
"""


def main(argv: list[str] | None = None) -> int:
    from dssync.lab.cluster import Cluster, load_cluster
    from dssync.lab.config import TrainConfig
    from dssync.lab.methods import for_method

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="s2-inter-rack")
    ap.add_argument("--method", default="dssync-topo-local")
    ap.add_argument("--workload", default="mnist")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--profile", action="store_true", help="keep rank 0's cProfile stats")
    a = ap.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="dssync-run-cost-"))
    cfg = TrainConfig(
        workload=a.workload, workload_options={"hidden": a.hidden}, eval_every=3, progress=False
    )
    (out / "config.json").write_text(json.dumps(asdict(for_method(cfg, a.method))))
    (out / "worker.py").write_text(WORKER)
    with Cluster(load_cluster(a.scenario)) as cluster:
        argv_ = [sys.executable, str(out / "worker.py"), str(out / "config.json"), str(out)]
        launched = time.time()
        result = cluster.run([*argv_, "1" if a.profile else "0"], timeout_s=600, log_dir=out)
        returned = time.time()
    if not result.ok:
        print(f"the run failed: {result.summary()}; logs in {out}", file=sys.stderr)
        return 1
    print(f"{a.method} on {a.scenario}: {returned - launched:.1f} s from launch to return")
    print("rank  to start  imports  training call  exit to return   (s)")
    for r in range(cluster.spec.world_size):
        t = json.loads((out / f"rank{r}.json").read_text())
        print(
            f"{r:4d}  {t['start'] - launched:8.1f}  {t['imported'] - t['start']:7.1f}  "
            f"{t['trained'] - t['imported']:13.1f}  {returned - t['end']:14.1f}"
        )
    if a.profile:
        print(f"rank 0's profile: {out / 'rank0.prof'} (python -m pstats)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
