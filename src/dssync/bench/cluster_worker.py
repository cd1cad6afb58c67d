"""One rank of ``dssync bench``: train a flat model with one method, write per-step timings.

Started inside a host namespace by :mod:`dssync.bench.cluster_bench`::

    python -m dssync.bench.cluster_worker --method dssync-topo --params 10000000 --steps 30 --out DIR

Rank r writes ``DIR/rank<r>.json``; rank 0 also writes ``DIR/progress.json`` once the warm-up
steps are done (the parent starts a scenario's timed link changes from there).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dssync.bench.sync_cost import FlatModel
from dssync.launch import exit_quietly, init_from_env
from dssync.schedules import Shuffle
from dssync.strategies import BSP, AdaptiveDSSync, DSSync, Hierarchical, Strategy
from dssync.topology import detect

METHODS = ("ddp", "hierarchical", "dssync", "dssync-topo")


def build(method: str, model: FlatModel, period: int, probe: bool) -> tuple[Strategy, dict]:
    """The strategy for ``method`` and facts worth reporting (topology, probe time)."""
    if method == "ddp":
        return BSP(model), {}
    if method == "dssync":
        return DSSync(model, schedule=Shuffle(2, seed=0, period=period)), {}
    t0 = time.monotonic()
    topo = detect(probe=probe and method == "dssync-topo")
    info = {"topology": topo.describe(), "detect_s": time.monotonic() - t0}
    if method == "hierarchical":
        return Hierarchical(model, topo), info
    if method == "dssync-topo":
        return AdaptiveDSSync(model, topo, replan_every=period), info
    raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def run(method: str, params: int, steps: int, warmup: int, period: int, probe: bool, out: Path) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = FlatModel(params)
    strategy, info = build(method, model, period, probe)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(params, generator=torch.Generator().manual_seed(rank))
    dist.barrier()
    records = []
    for step in range(steps):
        t0 = time.monotonic()
        strategy.model(x).backward()
        strategy.after_backward()
        optimizer.step()
        strategy.after_step()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.monotonic()
        records.append([t0, t1, strategy.take_sync_time()])
        if rank == 0 and step + 1 == warmup:
            pace = (t1 - records[min(1, step)][0]) / max(step, 1)
            (out / "progress.json").write_text(json.dumps({"pace_s": pace, "at": t1}))
    info["switches"] = getattr(strategy, "switches", [])
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "records": records, **info}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--params", type=int, default=10_000_000)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--period", type=int, default=8)
    p.add_argument("--probe", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    init_from_env(backend="gloo", timeout_s=a.timeout)
    try:
        run(a.method, a.params, a.steps, a.warmup, a.period, a.probe, a.out)
        dist.barrier()  # every rank has written its timings
    finally:
        dist.destroy_process_group()
    exit_quietly(0)


if __name__ == "__main__":
    main()
