"""One rank of ``dssync bench``: train a flat model with one method, write per-step timings.

Started by torchrun on every host of the emulated cluster (:mod:`dssync.lab.experiments.cluster_bench`)::

    torchrun ... -m dssync.lab.bench.cluster_worker --method dssync-topo --params 10000000 --out DIR

Rank r (torchrun's RANK) writes ``DIR/rank<r>.json`` with its host name, GROUP_RANK and LOCAL_RANK
(where torchrun placed it); rank 0 also writes ``DIR/progress.json`` once the warm-up
steps are done (the parent starts a scenario's timed link changes from there).

``--compute-ms C`` adds real compute to every step: matrix products on the CPU taking about C ms,
run before the forward pass (so a method that averages in the background, such as
``dssync-overlap``, can hide its transfer behind them; DDP's all-reduce starts after them). Each
rank also times a step without any synchronization (forward, backward and the matrix work) before
training, reported as ``compute_s``. ``--compute-kind idle`` waits C ms instead, leaving the CPU
free: an accelerator's compute as the host sees it (the GPU computes while the host's cores run
the transport), and what each host of a real cluster has to itself, where the emulated cluster's
hosts all share this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dssync.errors import UsageError
from dssync.lab.baselines.protocol import after_backward, take_sync_time, time_sync
from dssync.lab.bench.sync_cost import FlatModel
from dssync.lab.config import TrainConfig
from dssync.lab.launch import exit_quietly, init_from_env
from dssync.lab.methods import (
    OPTIONS,
    RATES,
    TOPOLOGY,
    build_strategy,
    configure,
    for_method,
    get_method,
    split_label,
)
from dssync.strategies import Strategy
from dssync.topology import detect


def device_for(name: str) -> torch.device:
    """``auto``: this rank's GPU (LOCAL_RANK) when CUDA is present, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
        )
    return torch.device(name)


def build(
    cfg: TrainConfig, model: FlatModel, optimizer: torch.optim.Optimizer, probe: bool
) -> tuple[Strategy, dict]:
    """The strategy for ``cfg.sync`` and facts worth reporting (topology, detection time).

    A method that needs the topology gets it detected here (with a bandwidth probe when asked
    and the method uses link rates), so the time it takes is reported.
    """
    needs = get_method(cfg.sync).needs
    if TOPOLOGY not in needs:
        return build_strategy(cfg, model, optimizer), {}
    t0 = time.monotonic()
    topo = detect(probe=probe and RATES in needs)
    info = {"topology": topo.describe(), "detect_s": time.monotonic() - t0}
    return build_strategy(cfg, model, optimizer, topo), info


class Burn:
    """Matrix products on the CPU taking about ``ms`` milliseconds per call (calibrated once);
    with ``kind="idle"`` a wait of ``ms`` that leaves the CPU free (an accelerator's compute).

    Example::

        burn = Burn(20.0)
        burn()            # about 20 ms of 128x128 matrix products
        Burn(20.0, kind="idle")()   # 20 ms asleep
    """

    KINDS = ("cpu", "idle")

    def __init__(self, ms: float, size: int = 128, kind: str = "cpu") -> None:
        if kind not in self.KINDS:
            raise ValueError(f"compute kind {kind!r} is not one of {', '.join(self.KINDS)}")
        self.idle_s = ms / 1000 if kind == "idle" else 0.0
        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(size, size, generator=g) / size**0.5
        self.b = torch.randn(size, size, generator=g)
        self.c = torch.empty(size, size)
        self.reps = 0
        if ms > 0 and not self.idle_s:
            self.reps = 20
            per = min(self._time() for _ in range(3)) / 20
            self.reps = max(1, round(ms / 1000 / per))

    def _time(self) -> float:
        t0 = time.perf_counter()
        self()
        return time.perf_counter() - t0

    def __call__(self) -> None:
        if self.idle_s:
            time.sleep(self.idle_s)
        for _ in range(self.reps):
            torch.mm(self.a, self.b, out=self.c)


def compute_time(model: FlatModel, x: torch.Tensor, burn: Burn, reps: int = 5) -> float:
    """Median seconds of one step's compute with no synchronization (forward, backward, burn)."""
    times = []
    for _ in range(reps):
        t0 = time.monotonic()
        burn()
        model(x).backward()
        model.zero_grad(set_to_none=True)
        times.append(time.monotonic() - t0)
    return sorted(times)[len(times) // 2]


def run(
    cfg: TrainConfig,
    params: int,
    steps: int,
    warmup: int,
    probe: bool,
    out: Path,
    compute_ms: float = 0.0,
    compute_kind: str = "cpu",
) -> None:
    rank = dist.get_rank()
    device = device_for(cfg.device)
    torch.manual_seed(0)
    model = FlatModel(params).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(params, generator=torch.Generator().manual_seed(rank)).to(device)
    burn = Burn(compute_ms, kind=compute_kind)
    compute_s = compute_time(model, x, burn)  # before DDP's hooks are on the parameters
    strategy, info = build(cfg, model, optimizer, probe)
    time_sync(strategy)  # each step's record holds take_sync_time()
    info["compute_s"] = compute_s
    dist.barrier()
    records = []
    for step in range(steps):
        t0 = time.monotonic()
        burn()
        strategy.model(x).backward()
        after_backward(strategy)
        optimizer.step()
        strategy.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t1 = time.monotonic()
        records.append([t0, t1, take_sync_time(strategy)])
        if rank == 0 and step + 1 == warmup:
            pace = (t1 - records[min(1, step)][0]) / max(step, 1)
            (out / "progress.json").write_text(json.dumps({"pace_s": pace, "at": t1}))
    if hasattr(strategy, "finish"):
        strategy.finish()  # an overlapped average still in flight completes before the exit
    info["switches"] = getattr(strategy, "switches", [])
    info["host"] = socket.gethostname()
    info["options"] = {k: getattr(cfg, k) for k in (*OPTIONS, "outer_lr", "group_size")}
    info["group_rank"] = int(os.environ.get("GROUP_RANK", 0))
    info["local_rank"] = int(os.environ.get("LOCAL_RANK", 0))
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "records": records, **info}))


def _label(text: str) -> str:
    """A method name or label (``dssync-topo:wire=int8``), checked as ``dssync bench`` checks it."""
    try:
        for_method(TrainConfig(sync=split_label(text)[0]), text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--method", type=_label, required=True, help="a method or label, as bench's")
    p.add_argument("--params", type=int, default=10_000_000)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=8)
    p.add_argument("--probe", action="store_true")
    p.add_argument("--compute-ms", type=float, default=0.0)
    p.add_argument("--compute-kind", choices=Burn.KINDS, default="cpu")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--options", type=json.loads, default={}, help="DS-Sync options, as JSON")
    a = p.parse_args(argv)
    init_from_env(backend="gloo", timeout_s=a.timeout)
    try:
        replan = a.repeat if get_method(a.method).options.get("replan") else None
        cfg = TrainConfig(
            sync=split_label(a.method)[0],
            schedule="shuffle",
            repeat=a.repeat,
            seed=0,
            timeout_s=a.timeout,
            device=a.device,
            **{"replan": replan, **a.options},
        )
        cfg = configure(for_method(cfg, a.method))
        run(cfg, a.params, a.steps, a.warmup, a.probe, a.out, a.compute_ms, a.compute_kind)
        dist.barrier()  # every rank has written its timings
    finally:
        dist.destroy_process_group()
    exit_quietly(0)


if __name__ == "__main__":
    main()
