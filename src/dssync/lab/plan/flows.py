"""A flow-level model of collectives on a cluster's links (alpha-beta, with shared links).

Every link of a :class:`ClusterSpec` is full duplex: ``host:<h>`` up and down, and with more than
one rack ``rack_uplink:<r>`` up and down. A message from rank a to rank b loads a's host link up,
b's host link down and, between racks, both rack uplinks (as in
:mod:`dssync.lab.bench.bounds`). Ranks on one host talk over memory: no link, no limit.

A collective is a ring: each member sends the same bytes to the next, in lockstep, so the whole
ring runs at the pace of its slowest edge. Rings that run at the same time share links max-min
fairly (progressive filling: raise every ring's rate together; a link that fills freezes the rings
that cross it); when a ring finishes, the others take over its share. Each ring also pays
``steps`` message latencies, the slowest hop's (the alpha term).

Example::

    >>> from dssync.lab.cluster import load_cluster
    >>> net = Net(load_cluster("tiny"), latency_s=0.0, goodput=1.0)
    >>> round(net.phase([Ring([0, 1], 1_000_000)]), 3)   # 1 MB each way over 50 Mbit/s
    0.16
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from dssync.lab.cluster.spec import ClusterSpec

# TCP payload per full frame at MTU 1500 (with timestamps), of the bytes a shaper counts.
GOODPUT = 1448 / 1514
LOCAL_FACTOR = 0.1  # a message between ranks of one host costs a tenth of a switch hop's latency


@dataclass(frozen=True)
class Ring:
    """``members`` pass ``nbytes`` round a ring (member i to i+1), in ``steps`` latency steps.

    ``Ring.allreduce(g, m)`` is a ring all-reduce of m bytes: 2(g-1)/g * m per edge, 2(g-1) steps.
    Other edge lists (a gather to a leader) can be given as ``edges``.

    Example::

        >>> r = Ring.allreduce([0, 1, 2, 3], 1_000_000)
        >>> r.nbytes, r.steps, r.pairs()[-1]
        (1500000.0, 6, (3, 0))
    """

    members: list[int]
    nbytes: float
    steps: int = 1
    edges: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def allreduce(cls, group: list[int], nbytes: float) -> Ring:
        g = len(group)
        return cls(list(group), 2 * (g - 1) / g * nbytes, 2 * (g - 1))

    def pairs(self) -> list[tuple[int, int]]:
        if self.edges is not None:
            return list(self.edges)
        g = len(self.members)
        return [] if g < 2 else [(self.members[i], self.members[(i + 1) % g]) for i in range(g)]


class Net:
    """The links of ``spec`` with their rates, and the time of rings that share them.

    ``rates`` overrides link rates by concrete name (``{"rack_uplink:0": 100.0}``); a rate of None
    is an unshaped link. ``latency_s`` is one message's latency through one switch; between racks
    a message crosses three (leaf, spine, leaf). ``goodput`` is the share of a link's rate that
    carries data (default: TCP payload per full Ethernet frame). ``host_s_per_byte`` is what a
    member's CPU spends on each byte it sends, receives and sums (the gamma term; 0 by default),
    added to the ring's time.

    Example::

        net = Net(load_cluster("s2-inter-rack"), rates={"rack_uplink:0": 100.0})
        net.phase([Ring.allreduce([0, 4], 16e6), Ring.allreduce([1, 5], 16e6)])  # share uplink 0
    """

    def __init__(
        self,
        spec: ClusterSpec,
        latency_s: float = 50e-6,
        rates: dict[str, float | None] | None = None,
        goodput: float = GOODPUT,
        host_s_per_byte: float = 0.0,
    ) -> None:
        self.spec = spec
        self.latency_s = latency_s
        self.host_s_per_byte = host_s_per_byte
        self.world = spec.world_size
        self.host = np.arange(self.world) // spec.workers_per_host
        self.rack = self.host // spec.hosts_per_rack
        link_rates = {**spec.link_rates(), **(rates or {})}
        h, k = spec.num_hosts, spec.racks
        caps = [_bytes_per_s(link_rates.get(f"host:{i}")) for i in range(h) for _ in (0, 1)]
        caps += [
            _bytes_per_s(link_rates.get(f"rack_uplink:{i}")) if spec.has_core else np.inf
            for i in range(k)
            for _ in (0, 1)
        ]
        self.caps = np.asarray(caps, dtype=float) * goodput

    def links_of(self, a: int, b: int) -> list[int]:
        """Indices of the (link, direction) a message from rank a to rank b loads."""
        ha, hb = int(self.host[a]), int(self.host[b])
        if ha == hb:
            return []
        out = [2 * ha, 2 * hb + 1]
        ra, rb = int(self.rack[a]), int(self.rack[b])
        if ra != rb:
            base = 2 * self.spec.num_hosts
            out += [base + 2 * ra, base + 2 * rb + 1]
        return out

    def hop_latency(self, a: int, b: int) -> float:
        if self.host[a] == self.host[b]:
            return LOCAL_FACTOR * self.latency_s
        return self.latency_s * (1 if self.rack[a] == self.rack[b] else 3)

    def phase(self, rings: list[Ring]) -> float:
        """Seconds until every ring of ``rings`` (all started together) has finished."""
        return max(self.finish_times(rings), default=0.0)

    def finish_times(self, rings: list[Ring]) -> list[float]:
        """Seconds at which each ring finishes: its share of the links, plus its latency steps.

        A ring with fewer than two members has nothing to send and finishes at 0.
        """
        real = [i for i, r in enumerate(rings) if len(r.members) > 1 and r.pairs()]
        out = [0.0] * len(rings)
        for i, t in zip(real, self._finish([rings[i] for i in real]), strict=True):
            out[i] = t
        return out

    def _finish(self, rings: list[Ring]) -> list[float]:
        if not rings:
            return []
        rows: list[int] = []
        cols: list[int] = []
        latency = np.zeros(len(rings))
        for j, ring in enumerate(rings):
            hop = 0.0
            for a, b in ring.pairs():
                links = self.links_of(a, b)
                rows += links
                cols += [j] * len(links)
                hop = max(hop, self.hop_latency(a, b))
            latency[j] = ring.steps * hop + ring.nbytes * self.host_s_per_byte
        use = sparse.csr_matrix(
            (np.ones(len(rows)), (rows, cols)), shape=(len(self.caps), len(rings))
        )
        left = np.array([r.nbytes for r in rings], dtype=float)
        done = np.zeros(len(rings))
        active = left > 0
        now = 0.0
        while active.any():
            rate = fair_rates(use, self.caps, active)
            if np.isinf(rate[active]).any():  # rings on unshaped links only: no bandwidth time
                free = active & np.isinf(rate)
                done[free] = now
                active &= ~free
                continue
            dt = np.min(left[active] / rate[active])
            now += dt
            left[active] -= rate[active] * dt
            finished = active & (
                left <= 1e-9 * np.maximum(1.0, np.array([r.nbytes for r in rings]))
            )
            done[finished] = now
            active &= ~finished
        return [float(x) for x in done + latency]


def fair_rates(use: sparse.csr_matrix, caps: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Max-min fair rate (bytes/s per edge) of each active ring; inf where no link limits it.

    ``use[l, j]`` is how many edges of ring j load (link, direction) l; a ring's rate counts once
    per edge on each link it crosses.
    """
    rate = np.zeros(use.shape[1])
    free = active.copy()
    left = caps.astype(float).copy()
    limited = np.isfinite(caps)
    while free.any():
        load = use @ free.astype(float)
        busy = limited & (load > 0)
        if not busy.any():
            rate[free] = np.inf
            break
        share = np.full(len(caps), np.inf)
        share[busy] = left[busy] / load[busy]
        inc = share.min()
        rate[free] += inc
        left -= inc * load
        full = busy & (share <= inc * (1 + 1e-9))
        frozen = free & (use.T @ full.astype(float) > 0)
        free &= ~frozen
    return rate


def _bytes_per_s(mbit: float | None) -> float:
    return np.inf if mbit is None else float(mbit) * 1e6 / 8
