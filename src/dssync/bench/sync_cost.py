"""The cost of one synchronization step, measured side by side in one run.

For a flat model of M parameters, every rank times, interleaved step by step:
  raw     one ``dist.all_reduce`` of a flat M-element tensor over this step's DS-Sync group;
  raw_avg the same all_reduce followed by the division by the group size: the least an average
          costs, so ``dssync / raw_avg`` is what the machinery (buckets, groups) adds;
  dssync  ``DSSync.step()`` over the same groups (buckets, group lookup, averaging);
  ddp     DDP's gradient all-reduce over all ranks: backward under DDP minus backward under
          ``no_sync()`` on the same model.
A step's time is the slowest rank's. Raw and DS-Sync run back to back in alternating order, and
the overhead is the median over steps of their per-step ratio, so a slow moment of a shared machine
hits both sides of a ratio instead of one median (the ratio of the two medians is reported too).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dssync.schedules import Shuffle, group_of
from dssync.strategies import DSSync


class FlatModel(nn.Module):
    """``n_tensors`` parameter vectors adding up to ``numel`` parameters; forward is a cheap dot product."""

    def __init__(self, numel: int, n_tensors: int = 10) -> None:
        super().__init__()
        sizes = [numel // n_tensors] * n_tensors
        sizes[-1] += numel - sum(sizes)
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(n) * 0.01) for n in sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum((w * x[: w.numel()]).sum() for w in self.weights)


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _timed(fn) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return _slowest(time.perf_counter() - t0)


def measure(numel: int, group_size: int, steps: int, seed: int = 0, bucket_mb: float = 25.0) -> dict[str, Any]:
    """Run on every rank of an initialized process group; returns medians in seconds."""
    world, rank = dist.get_world_size(), dist.get_rank()
    schedule = Shuffle(group_size, seed=seed, period=8)
    torch.manual_seed(0)
    model = FlatModel(numel)
    sync = DSSync(model, schedule=schedule, bucket_bytes=int(bucket_mb * 2**20))

    raw_groups: dict[tuple[int, ...], Any] = {}
    for s in range(8):  # the same distinct groups, created with plain new_group
        for g in schedule.partition(s, world):
            if tuple(g) not in raw_groups:
                raw_groups[tuple(g)] = dist.new_group(g)
    flat = torch.randn(numel)

    ddp_model = FlatModel(numel)
    ddp = DistributedDataParallel(ddp_model)
    x = torch.randn(numel)

    def raw_step(s: int) -> int:
        g = group_of(schedule.partition(s, world), rank)
        dist.all_reduce(flat, group=raw_groups[tuple(g)])
        return len(g)

    def raw_average(s: int) -> None:
        flat.div_(raw_step(s))

    def ddp_backward() -> None:
        ddp(x).backward()

    def local_backward() -> None:
        with ddp.no_sync():
            ddp(x).backward()

    def dssync_step(s: int) -> None:
        sync.steps = s
        sync.step()

    times: dict[str, list[float]] = {"raw": [], "raw_avg": [], "dssync": [], "ddp_backward": [],
                                     "local_backward": []}
    for s in range(-2, steps):  # two warm-up steps
        row = {}
        trio = [("raw", raw_step), ("raw_avg", raw_average), ("dssync", dssync_step)]
        for name, fn in trio if s % 2 == 0 else trio[::-1]:
            row[name] = _timed(lambda fn=fn, s=s: fn(s % 8))
        row["ddp_backward"] = _timed(ddp_backward)
        row["local_backward"] = _timed(local_backward)
        if s >= 0:
            for k, v in row.items():
                times[k].append(v)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = sorted(d / r for d, r in zip(times["dssync"], times["raw"], strict=True))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    vs_avg = statistics.median(d / r for d, r in zip(times["dssync"], times["raw_avg"], strict=True))
    return {
        "world_size": world, "numel": numel, "group_size": group_size, "steps": steps, "bucket_mb": bucket_mb,
        "raw_s": med["raw"], "raw_avg_s": med["raw_avg"], "dssync_s": med["dssync"],
        "ddp_s": max(med["ddp_backward"] - med["local_backward"], 0.0),
        "ddp_backward_s": med["ddp_backward"], "local_backward_s": med["local_backward"],
        "overhead": statistics.median(ratios), "overhead_q1": quartiles[0], "overhead_q3": quartiles[2],
        "overhead_of_medians": med["dssync"] / med["raw"], "overhead_vs_raw_avg": vs_avg,
    }
