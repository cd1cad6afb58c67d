"""A short, bounded bandwidth probe: timed pairwise exchanges over pre-planned pairs.

Every rank takes part in ``rounds`` rounds; in each round the ranks form disjoint pairs (the
circle method of a round-robin tournament) and each pair swaps ``nbytes`` both ways at once.
Each exchange is timed after a tiny exchange that lines the pair up, so waiting is not counted.
One all_reduce of a world x world matrix shares the results. Every collective runs on a process
group whose timeout is ``timeout_s``, so a dead peer cannot hang the probe.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

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


def probe_bandwidth(topo: Topology, nbytes: int = 2_000_000, rounds: int = 7, timeout_s: float = 60.0,
                    group: dist.ProcessGroup | None = None) -> Topology:
    """Measure pairwise rates and return ``topo`` with host rates, uplink rate and slow hosts.

    All ranks of ``group`` call this. Takes ``rounds`` exchanges of ``nbytes`` each way.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    ranks = list(range(world)) if group is None else dist.get_process_group_ranks(group)
    pg = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
    plan = probe_pairs(world, rounds)
    rates = torch.zeros(len(plan), world, dtype=torch.float64)  # rates[round, rank]: my pair's Mbit/s
    send = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
    recv = torch.empty_like(send)
    tiny, tiny_in = torch.zeros(1), torch.zeros(1)
    for i, pairs in enumerate(plan):
        partner = next((b if a == rank else a for a, b in pairs if rank in (a, b)), None)
        if partner is not None:
            peer = ranks[partner]
            _swap(tiny, tiny_in, peer, pg)
            t0 = time.perf_counter()
            _swap(send, recv, peer, pg)
            rates[i, rank] = send.numel() * 4 * 8 / (time.perf_counter() - t0) / 1e6
        dist.barrier(group=pg)
    dist.all_reduce(rates, group=pg)
    dist.destroy_process_group(pg)
    return infer_rates(topo, plan, rates.tolist())


def _swap(out: torch.Tensor, into: torch.Tensor, peer: int, pg: dist.ProcessGroup) -> None:
    works = [dist.isend(out, peer, group=pg), dist.irecv(into, peer, group=pg)]
    for w in works:
        w.wait()


def infer_rates(topo: Topology, plan: list[list[tuple[int, int]]], rates: list[list[float]]) -> Topology:
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

