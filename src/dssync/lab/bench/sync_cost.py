"""The cost of one synchronization step, measured side by side in one run.

For a flat model of M parameters, every rank times, interleaved step by step:
  raw     one ``dist.all_reduce`` of a flat M-element tensor over this step's DS-Sync group;
  raw_avg the same all_reduce followed by the division by the group size: the least an average
          costs, so ``dssync / raw_avg`` is what the machinery (buckets, groups) adds;
  dssync  ``DSSync.step()`` over the same groups (buckets, routing, chunked exchange, step tag);
  raw_exchange  one whole-buffer ``batch_isend_irecv`` with the partner, then add and halve: the
          least a point-to-point pair average costs, so ``dssync / raw_exchange`` is what chunking,
          tags and routing add. With a compressed ``wire`` it is that format's least: encode with
          the residual, swap the messages, decode the peer's, the mean of the two in rank order
          into the buffer (what DS-Sync's pair does, less the tags); the fp32 exchange is timed
          beside it (``raw_fp32_exchange``);
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

from dssync.comm.exchange import swap_ops
from dssync.comm.wire import codec_for, encode_with_feedback, mean_in_order
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


def measure(
    numel: int,
    group_size: int,
    steps: int,
    seed: int = 0,
    bucket_mb: float = 25.0,
    wire: str = "fp32",
    nonfinite: str = "raise",
) -> dict[str, Any]:
    """Run on every rank of an initialized process group; returns medians in seconds.

    With a compressed ``wire`` the DS-Sync step sends that format; ``encode_s`` is then what the
    format costs on this rank alone per step (encode with the residual, decode its own and one
    peer's message, and the group mean), the part that ``dssync / raw_exchange`` adds beyond
    the smaller transfer. ``nonfinite="spread"`` times the step without its finiteness check
    (one read of the buffers), which no raw method makes."""
    world, rank = dist.get_world_size(), dist.get_rank()
    schedule = Shuffle(group_size, seed=seed, repeat=8)
    torch.manual_seed(0)
    model = FlatModel(numel)
    sync = DSSync(
        model,
        schedule=schedule,
        bucket_bytes=int(bucket_mb * 2**20),
        wire=wire,
        nonfinite=nonfinite,
    )
    codec, residual = codec_for(wire), torch.zeros(numel)

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

    recv = torch.empty_like(flat)

    def raw_exchange(s: int) -> None:
        g = group_of(schedule.partition(s, world), rank)
        if len(g) != 2:  # groups of another size: the all_reduce average
            raw_average(s)
            return
        peer = g[0] if g[1] == rank else g[1]
        ops = swap_ops(recv, flat, peer)
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        flat.add_(recv).div_(2)

    def ddp_backward() -> None:
        ddp(x).backward()

    def local_backward() -> None:
        with ddp.no_sync():
            ddp(x).backward()

    def dssync_step(s: int) -> None:
        sync.steps, sync.averagings = s, s  # the raw ops' group: the partition of step s
        sync.step()

    # the compressed exchange works on pieces as large as DS-Sync's buckets, as its encodings
    # do: one whole-model encoding makes temporaries the allocator maps afresh at every call
    per = max(int(bucket_mb * 2**20) // 4, 1)
    pieces = [slice(i, min(i + per, numel)) for i in range(0, numel, per)]
    wire_residual = torch.zeros(numel)
    got = [codec.empty(sl.stop - sl.start, flat) for sl in pieces]

    def raw_wire_exchange(s: int) -> None:
        g = group_of(schedule.partition(s, world), rank)
        if len(g) != 2:
            raw_average(s)
            return
        peer = g[0] if g[1] == rank else g[1]
        sent = [encode_with_feedback(codec, flat[sl], wire_residual[sl]) for sl in pieces]
        ops = [
            op
            for (msg, _), into in zip(sent, got, strict=True)
            for out, theirs in zip(msg, into, strict=True)
            for op in swap_ops(theirs, out, peer)
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        for sl, (_, mine), into in zip(pieces, sent, got, strict=True):
            theirs = codec.decode(into, sl.stop - sl.start, flat.dtype)
            mean_in_order([mine, theirs] if rank < peer else [theirs, mine], out=flat[sl])

    def encode_only() -> float:
        t0 = time.perf_counter()
        for sl in pieces:  # in DS-Sync's bucket sizes, as the step encodes
            msg, mine = encode_with_feedback(codec, flat[sl], residual[sl])
            theirs = codec.decode(msg, sl.stop - sl.start, flat.dtype)
            mean_in_order([mine, theirs])
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {
        "raw": [],
        "raw_avg": [],
        "dssync": [],
        "raw_exchange": [],
        "ddp_backward": [],
        "local_backward": [],
        "encode": [],
        "raw_fp32_exchange": [],
    }
    compressed = wire != "fp32"
    for s in range(-2, steps):  # two warm-up steps
        row = {}
        trio = [
            ("raw", raw_step),
            ("raw_avg", raw_average),
            ("dssync", dssync_step),
            ("raw_exchange", raw_wire_exchange if compressed else raw_exchange),
        ]
        if compressed:
            trio.append(("raw_fp32_exchange", raw_exchange))
        for name, fn in trio if s % 2 == 0 else trio[::-1]:
            row[name] = _timed(lambda fn=fn, s=s: fn(s % 8))
        row["encode"] = encode_only() if compressed else 0.0
        row["ddp_backward"] = _timed(ddp_backward)
        row["local_backward"] = _timed(local_backward)
        if s >= 0:
            for k, v in row.items():
                times[k].append(v)
    if not compressed:
        times["raw_fp32_exchange"] = times["raw_exchange"]
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = sorted(d / r for d, r in zip(times["dssync"], times["raw"], strict=True))
    quartiles = _quartiles(ratios)
    exchange = _quartiles(
        [d / r for d, r in zip(times["dssync"], times["raw_exchange"], strict=True)]
    )
    vs_avg = statistics.median(
        d / r for d, r in zip(times["dssync"], times["raw_avg"], strict=True)
    )
    return {
        "world_size": world,
        "numel": numel,
        "group_size": group_size,
        "steps": steps,
        "bucket_mb": bucket_mb,
        "wire": wire,
        "nonfinite": nonfinite,
        "wire_bytes": codec.nbytes(numel),
        "encode_s": med["encode"],
        "raw_s": med["raw"],
        "raw_avg_s": med["raw_avg"],
        "dssync_s": med["dssync"],
        "ddp_s": max(med["ddp_backward"] - med["local_backward"], 0.0),
        "ddp_backward_s": med["ddp_backward"],
        "local_backward_s": med["local_backward"],
        "overhead": statistics.median(ratios),
        "overhead_q1": quartiles[0],
        "overhead_q3": quartiles[2],
        "overhead_of_medians": med["dssync"] / med["raw"],
        "overhead_vs_raw_avg": vs_avg,
        "raw_exchange_s": med["raw_exchange"],
        "overhead_vs_raw_exchange": exchange[1],
        "exchange_q1": exchange[0],
        "exchange_q3": exchange[2],
        "raw_fp32_exchange_s": med["raw_fp32_exchange"],
        "overhead_vs_fp32_exchange": statistics.median(
            d / r for d, r in zip(times["dssync"], times["raw_fp32_exchange"], strict=True)
        ),
    }


def _quartiles(values: list[float]) -> list[float]:
    """First quartile, median and third quartile of ``values``."""
    return statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def measure_scale(
    numel: int, steps: int, seed: int = 0, nonfinite: str = "raise"
) -> dict[str, Any]:
    """Many ranks, ``Shuffle(2)`` that never repeats: today's averaging core against the old path.

    new: ``DSSync.step()`` (pairs by point-to-point exchange on the world group, tagged);
    old: the previous path, a :class:`~dssync.comm.GroupCache` that makes a process group for each
         new pair (every rank enters ``new_group``), then all_reduce and divide;
    tag: the tag alone (an exchange with no data), i.e. what step checking adds to an average.
    ``nonfinite`` is the DS-Sync step's finiteness check (``DSSync``'s option: "spread" leaves
    it out). Each op is timed on every rank after a barrier; a step's time is the slowest
    rank's. Returns start-up seconds, p50/p99 per-step seconds and the process groups
    created after step 1.
    """
    from dssync.comm import FlatBuckets, GroupCache
    from dssync.comm.tags import STEP

    world, rank = dist.get_world_size(), dist.get_rank()
    schedule = Shuffle(2, seed=seed)
    torch.manual_seed(0)

    dist.barrier()
    t0 = time.perf_counter()
    sync = DSSync(FlatModel(numel), schedule=schedule, broadcast_init=False, nonfinite=nonfinite)
    new_start = _slowest(time.perf_counter() - t0)

    dist.barrier()
    t0 = time.perf_counter()
    cache = GroupCache(max_groups=128)
    old_buckets = FlatBuckets(list(FlatModel(numel).parameters()))
    old_start = _slowest(time.perf_counter() - t0)

    local = torch.zeros(3, steps, dtype=torch.float64)
    made: dict[str, int] = {}
    for s in range(steps):
        group = group_of(schedule.partition(s, world), rank)
        dist.barrier()
        t0 = time.perf_counter()
        sync.steps = s
        sync.step()
        local[0, s] = time.perf_counter() - t0

        dist.barrier()
        t0 = time.perf_counter()
        cache.prepare(schedule.partition(s, world))
        pg = cache.get(group)
        for b in old_buckets.buffers:
            dist.all_reduce(b, group=pg)
            b.div_(len(group))
        local[1, s] = time.perf_counter() - t0

        dist.barrier()
        t0 = time.perf_counter()
        sync.router.average(group, STEP, s)  # no buffers: the tag alone
        local[2, s] = time.perf_counter() - t0
        if s == 0:
            made = {"new": sync.groups_created, "old": cache.created}
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    new, old, tag = (local[i].tolist() for i in range(3))
    return {
        "world_size": world,
        "numel": numel,
        "steps": steps,
        "nonfinite": nonfinite,
        "new_start_s": new_start,
        "old_start_s": old_start,
        "new_groups_after_step1": sync.groups_created - made["new"],
        "old_groups_after_step1": cache.created - made["old"],
        "new_p50_s": _quantile(new, 0.5),
        "new_p99_s": _quantile(new, 0.99),
        "old_p50_s": _quantile(old, 0.5),
        "old_p99_s": _quantile(old, 0.99),
        "tag_p50_s": _quantile(tag, 0.5),
        "tag_p99_s": _quantile(tag, 0.99),
    }
