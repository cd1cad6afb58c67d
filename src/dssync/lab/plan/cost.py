"""Predicted seconds per iteration of each method on a cluster, from its links (see flows.py).

* ``ddp``: one ring all-reduce of the gradients over all ranks, in rank order (a rack's ranks
  are neighbours, so the ring crosses each rack uplink once each way), after the compute.
* ``hierarchical``: reduce inside each domain (a ring reduce-scatter, then a gather to the
  leader), a ring all-reduce among the leaders, a broadcast back (scatter, then ring all-gather).
* ``dssync``: random pairs (``Shuffle(2)``, repeating every ``repeat`` steps) average parameters;
  all pairs of a step run at once and share links; with no barrier, each rank waits only for its
  own partners, so the pace comes from following every rank's clock (see :func:`schedule_s`).
* ``dssync-topo``: the same for :func:`dssync.schedules.plan_topology_aware`'s plan.
* ``dssync-topo overlapped``: max(compute, averaging), as if averaging ran behind the next
  step's compute. No dssync strategy does this yet; it is the model's ceiling, labelled as such.

Example::

    >>> from dssync.lab.cluster import load_cluster
    >>> p = predict(load_cluster("s2-inter-rack"), params=4_000_000, compute_s=0.05)
    >>> [x.method for x in p][:2]
    ['ddp', 'hierarchical']
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dssync.lab.cluster.spec import ClusterSpec
from dssync.lab.plan.flows import Net, Ring
from dssync.schedules import Schedule, Shuffle
from dssync.schedules.base import Partition, part_fraction
from dssync.schedules.topology import SPREAD, plan_topology_aware
from dssync.topology import Topology

METHODS = ("ddp", "hierarchical", "dssync", "dssync-topo", "dssync-topo overlapped")
BYTES_PER_PARAM = 4  # float32


@dataclass(frozen=True)
class Prediction:
    """One method's predicted iteration: ``sync_s`` of communication, ``iter_s`` in all.

    Example::

        Prediction("ddp", sync_s=1.12, iter_s=1.17)  # a 50 ms compute, then 1.12 s of all-reduce
    """

    method: str
    sync_s: float
    iter_s: float


class Repeating(Schedule):
    """``schedule``'s first ``repeat`` partitions, over and over (what the bench runs); each
    partition is computed once.

    Example::

        >>> Repeating(Shuffle(2, seed=0), 8).partition(9, 4) == Shuffle(2, seed=0).partition(1, 4)
        True
    """

    def __init__(self, schedule: Schedule, repeat: int) -> None:
        self.schedule, self.repeat = schedule, repeat
        self._seen: dict[tuple[int, int], Partition] = {}

    def partition(self, step: int, world_size: int) -> Partition:
        key = (step % self.repeat, world_size)
        if key not in self._seen:
            self._seen[key] = self.schedule.partition(key[0], world_size)
        return [list(g) for g in self._seen[key]]

    def part(self, group: list[int], step: int, world_size: int) -> tuple[int, int]:
        return self.schedule.part(group, step % self.repeat, world_size)

    def describe(self) -> str:
        return f"Repeating({self.schedule.describe()}, repeat={self.repeat})"

    def cycle(self, world_size: int) -> int | None:
        return self.repeat


def topology_of(spec: ClusterSpec, rates: dict[str, float | None] | None = None) -> Topology:
    """The :class:`Topology` of ``spec`` with ``rates`` applied (as a probe would report them)."""
    topo = spec.topology()
    if not rates:
        return topo
    hosts = {h: rates.get(f"host:{h}", v) for h, v in topo.host_mbit.items()}
    ups = [v for k, v in rates.items() if k.startswith("rack_uplink") and v is not None]
    return topo.with_rates(hosts, min(ups) if ups else topo.uplink_mbit)


def schedules(
    spec: ClusterSpec,
    repeat: int = 8,
    rates: dict[str, float | None] | None = None,
    known: Topology | None = None,
    spread: bool = SPREAD,
) -> dict[str, Schedule]:
    """The DS-Sync schedules the planner compares: random pairs and the topology-aware plan.

    The plan is made from ``known`` (what topology detection told the job) when given, else from
    the cluster's own rates; ``spread`` as in :class:`~dssync.schedules.TopologyAware`.
    """
    topo = plan_topology_aware(known or topology_of(spec, rates), max_every=repeat, spread=spread)
    return {
        "dssync": Repeating(Shuffle(2, seed=0), repeat),
        "dssync-topo": Repeating(topo, topo.repeat),
    }


def schedule_s(
    net: Net,
    schedule: Schedule,
    nbytes: float,
    compute_s: float = 0.0,
    window: range | None = None,
    cycles: int = 32,
) -> float:
    """Seconds of averaging per step, on average, when ranks wait only for their own group.

    There is no barrier in DS-Sync: a group starts when its last member has finished its compute
    and its previous group, and it lasts as long as the flow model says for that step (all groups
    of a step share the links). Following every rank's clock through the steps (a max-plus
    simulation) gives the pace; a slow group delays its members, their next partners, and so on.
    The pace is measured over ``window`` (a run's timed steps; the clocks start at step 0), else
    over the second half of ``cycles`` cycles. Returns pace - compute.
    """
    n = net.world
    cycle = schedule.cycle(n) or 8
    steps = window if window is not None else range(cycles * cycle // 2, cycles * cycle)
    durations: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    clock = np.zeros(n)
    start = None
    for t in range(steps.stop):
        if t == steps.start:
            start = clock.copy()
        key = t % cycle
        if key not in durations:
            groups = schedule.partition(t, n)
            shares = [part_fraction(schedule.part(g, t, n)) for g in groups]
            durations[key] = _step_durations(net, groups, nbytes, shares)
        ids, length = durations[key]
        ready = clock + compute_s
        begin = np.full(len(length), -np.inf)
        np.maximum.at(begin, ids, ready)
        clock = begin[ids] + length[ids]
    pace = float(np.mean(clock - start)) / max(len(steps), 1)
    return pace - compute_s


def _step_durations(
    net: Net, groups: list[list[int]], nbytes: float, shares: list[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's group index, and each group's seconds when all groups of the step run at once
    (group i moving ``shares[i]`` of ``nbytes``: the slice its schedule gives it)."""
    shares = shares or [1.0] * len(groups)
    ids = np.empty(net.world, dtype=np.int64)
    for i, g in enumerate(groups):
        ids[g] = i
    length = np.zeros(len(groups))
    pairs = [i for i, g in enumerate(groups) if len(g) > 1]
    length[pairs] = net.finish_times([Ring.allreduce(groups[i], nbytes * shares[i]) for i in pairs])
    return ids, length


def ring_s(net: Net, nbytes: float) -> float:
    """Seconds of one ring all-reduce over every rank."""
    return net.phase([Ring.allreduce(list(range(net.world)), nbytes)])


def hierarchical_s(net: Net, nbytes: float, domains: list[list[int]]) -> float:
    """Seconds of reduce in each domain, all-reduce among leaders, broadcast back."""
    if len(domains) == 1:
        return ring_s(net, nbytes)
    half = [Ring(d, (len(d) - 1) / len(d) * nbytes, len(d) - 1) for d in domains if len(d) > 1]
    gather = [
        Ring(d, nbytes / len(d), 1, tuple((r, d[0]) for r in d[1:])) for d in domains if len(d) > 1
    ]
    scatter = [
        Ring(d, nbytes / len(d), 1, tuple((d[0], r) for r in d[1:])) for d in domains if len(d) > 1
    ]
    leaders = [Ring.allreduce([d[0] for d in domains], nbytes)]
    return sum(net.phase(p) for p in (half, gather, leaders, scatter, half))


def predict(
    spec: ClusterSpec,
    params: int,
    compute_s: float = 0.0,
    repeat: int = 8,
    latency_s: float = 50e-6,
    rates: dict[str, float | None] | None = None,
    known: Topology | None = None,
    window: range | None = None,
    plans: dict[str, Schedule] | None = None,
    host_s_per_byte: float = 0.0,
    spread: bool = SPREAD,
) -> list[Prediction]:
    """Each method of :data:`METHODS` on ``spec``, for a model of ``params`` float32 parameters.

    ``rates`` overrides link rates (``{"rack_uplink:0": 100.0}``); ``known`` is the topology the
    topology-aware plan is made from; ``window`` the steps a run times (default: one cycle);
    ``plans`` the schedules, if :func:`schedules` already made them; ``host_s_per_byte`` the
    CPU's cost per byte of a ring edge (see :class:`Net`); ``spread`` whether the topology-aware
    plan spreads its crossings over the steps.
    """
    net = Net(spec, latency_s=latency_s, rates=rates, host_s_per_byte=host_s_per_byte)
    nbytes = BYTES_PER_PARAM * params
    plans = plans or schedules(spec, repeat, rates, known, spread)
    domains = (known or topology_of(spec)).domains()
    sync = {
        "ddp": ring_s(net, nbytes),
        "hierarchical": hierarchical_s(net, nbytes, domains),
        "dssync": schedule_s(net, plans["dssync"], nbytes, compute_s, window),
        "dssync-topo": schedule_s(net, plans["dssync-topo"], nbytes, compute_s, window),
    }
    out = [Prediction(m, float(s), float(compute_s + s)) for m, s in sync.items()]
    topo = sync["dssync-topo"]
    out.append(Prediction("dssync-topo overlapped", float(topo), float(max(compute_s, topo))))
    return out
