"""A short, bounded bandwidth probe: timed pairwise exchanges over pre-planned pairs.

Every rank takes part in ``rounds`` rounds; in each round the ranks form disjoint pairs (the
circle method of a round-robin tournament) and each pair swaps ``nbytes`` both ways at once.
Each exchange is timed after a tiny exchange that lines the pair up, so waiting is not counted.
One all_reduce of a world x world matrix shares the results. Every collective runs on a process
group whose timeout is ``timeout_s``, so a dead peer cannot hang the probe.

Data and metadata: the probe measures the links as training will use them, so the timed
exchanges (and the tiny line-up, which also lets nccl build the pair's connection before the
clock starts) send ``dtype`` tensors on ``device`` (the parameters' device and dtype) through a
group with the training group's backend. A gloo probe on a GPU cluster would time the TCP path,
not NVLink or InfiniBand. The clock is read after the device has finished
(:func:`dssync.comm.clock.clock`). The barriers between rounds and the shared float64 results
are metadata and go through a gloo group (the same group when training runs gloo).
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from dssync.comm.clock import clock
from dssync.comm.exchange import swap_ops, wait
from dssync.comm.side import renamed_group
from dssync.comm.tags import PROBE, Tag
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.topology.model import Topology


def probe_pairs(world_size: int, rounds: int) -> list[list[tuple[int, int]]]:
    """Disjoint pairs for each of ``rounds`` rounds (round-robin, circle method).

    Example::

        >>> probe_pairs(4, 3)
        [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    """
    n = world_size + (world_size % 2)  # a dummy rank n-1 sits out when world_size is odd
    if n < 2:
        return []
    others = list(range(1, n))
    plan = []
    for _ in range(min(rounds, n - 1)):
        ring = [0, *others]
        pairs = [tuple(sorted((ring[i], ring[n - 1 - i]))) for i in range(n // 2)]
        plan.append(sorted(p for p in pairs if max(p) < world_size))
        others = others[-1:] + others[:-1]
    return plan


def probe_bandwidth(
    topo: Topology,
    nbytes: int = 2_000_000,
    rounds: int = 7,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    process_group: dist.ProcessGroup | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    group: dist.ProcessGroup | None = None,
) -> Topology:
    """Measure pairwise rates and return ``topo`` with host rates, uplink rate and slow hosts.

    All ranks of ``process_group`` call this (``group=``: its deprecated older name). Takes ``rounds`` exchanges of ``nbytes`` each way, of
    ``dtype`` tensors on ``device`` (default: the current CUDA device when ``group`` runs nccl,
    else the CPU); pass the parameters' device and dtype to measure what training will see.
    """
    group = renamed_group(process_group, group, "probe_bandwidth")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    backend = dist.get_backend(group)
    device = torch.device(device) if device is not None else _default_device(backend)
    data = _probe_group(ranks, backend, timeout_s)
    meta = data if backend == dist.Backend.GLOO else _probe_group(ranks, "gloo", timeout_s)
    plan = probe_pairs(world, rounds)
    rates = torch.zeros(
        len(plan), world, dtype=torch.float64
    )  # rates[round, rank]: my pair's Mbit/s
    item = torch.empty((), dtype=dtype).element_size()
    send = torch.ones(max(nbytes // item, 1), dtype=dtype, device=device)
    recv = torch.empty_like(send)
    tiny, tiny_in = (
        torch.zeros(1, dtype=dtype, device=device),
        torch.zeros(1, dtype=dtype, device=device),
    )
    if backend != dist.Backend.GLOO:  # an nccl communicator's first op must be a collective
        first = dist.all_reduce(tiny, group=data, async_op=True)
        wait(
            first,
            time.monotonic() + timeout_s,
            Tag(PROBE, 0, 1),
            list(range(world)),
            timeout_s,
            process_group=data,
        )
    for i, pairs in enumerate(plan):
        partner = next((b if a == rank else a for a, b in pairs if rank in (a, b)), None)
        if partner is not None:
            peer = ranks[partner]
            _swap(tiny, tiny_in, peer, data, timeout_s)
            t0 = clock(device)
            _swap(send, recv, peer, data, timeout_s)
            rates[i, rank] = send.numel() * item * 8 / (clock(device) - t0) / 1e6
        dist.barrier(group=meta)
    dist.all_reduce(rates, group=meta)
    for pg in {data, meta}:
        dist.destroy_process_group(pg)
    return infer_rates(topo, plan, rates.tolist())


def _default_device(backend: str) -> torch.device:
    if backend == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _probe_group(ranks: list[int], backend: str, timeout_s: float) -> dist.ProcessGroup:
    """A group over ``ranks`` just for the probe; only its members take part in making it."""
    return dist.new_group(
        ranks,
        backend=backend,
        timeout=timedelta(seconds=timeout_s),
        use_local_synchronization=len(ranks) != dist.get_world_size(),
    )


def _swap(
    out: torch.Tensor, into: torch.Tensor, peer: int, pg: dist.ProcessGroup, timeout_s: float
) -> None:
    """Send ``out`` to global rank ``peer`` while receiving ``into`` from it, in one batch.

    One ``batch_isend_irecv`` posts both (separate isend and irecv calls may deadlock on nccl,
    where each opens its own group call), the receive first (:func:`swap_ops`); each wait is
    bounded by ``timeout_s`` and a peer that never answers raises :class:`~dssync.errors.PeerLost`.
    """
    ops = swap_ops(into, out, peer, pg)
    deadline = time.monotonic() + timeout_s
    tag = Tag(PROBE, 0, out.numel())
    for w in dist.batch_isend_irecv(ops):
        wait(w, deadline, tag, [dist.get_rank(), peer], timeout_s, [peer], process_group=pg)


def infer_rates(
    topo: Topology, plan: list[list[tuple[int, int]]], rates: list[list[float]]
) -> Topology:
    """Host rates (median of their pairs inside a rack) and the uplink (crossing throughput per round).

    ``rates[i][r]`` is what rank r measured with its partner in round i (0 if it sat out).
    """
    per_host: dict[int, list[float]] = {}
    crossing_totals: list[float] = []
    for i, pairs in enumerate(plan):
        crossing = 0.0
        for a, b in pairs:
            rate = min(rates[i][a], rates[i][b])  # both ends timed the same exchange
            if topo.hosts[a] == topo.hosts[b]:
                continue  # same host: says nothing about links
            if topo.racks[a] != topo.racks[b]:
                crossing += rate
                continue
            per_host.setdefault(topo.hosts[a], []).append(rate)
            per_host.setdefault(topo.hosts[b], []).append(rate)
        if crossing:
            crossing_totals.append(crossing)
    # a pair is as slow as its slower end, so a host's rate is the best of its pairs
    host_mbit = {h: max(v) for h, v in per_host.items()}
    uplink = statistics.median(crossing_totals) if crossing_totals else None
    return topo.with_rates(host_mbit, uplink)
