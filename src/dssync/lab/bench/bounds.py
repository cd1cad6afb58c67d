"""Lower bounds from link rates: the bytes a method must push over its busiest link / that link's rate.

Each collective is modelled with a bandwidth-optimal algorithm on the cluster's links (a ring
all-reduce of M bytes over g members sends 2(g-1)/g * M from each member to the next). A byte
from rank a to rank b loads a's host link upward and b's downward (none on the same host), and
both rack uplinks when the racks differ. Links are full duplex and each direction has the link's
rate. Groups that run at the same time share links; phases that depend on each other add up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from dssync.lab.cluster.spec import ClusterSpec
from dssync.lab.methods import get_method
from dssync.schedules import Schedule, Shuffle
from dssync.schedules.base import part_fraction
from dssync.schedules.topology import plan_topology_aware

Send = tuple[int, int, float]  # (from rank, to rank, bytes)


def ring_allreduce(group: list[int], nbytes: float) -> list[Send]:
    g = len(group)
    if g < 2:
        return []
    return [(group[i], group[(i + 1) % g], 2 * (g - 1) / g * nbytes) for i in range(g)]


def all_to_all(group: list[int], nbytes: float) -> list[Send]:
    """A compressed average of a group of three or more (:mod:`dssync.comm.transport`): each member
    sends each other member a 1/g share of ``nbytes``, then that share's mean back (two stages)."""
    g = len(group)
    return [(a, b, 2 * nbytes / g) for a in group for b in group if a != b]


def link_loads(spec: ClusterSpec, sends: Iterable[Send]) -> dict[tuple[str, str], float]:
    """Bytes on each (link, direction) for ``sends``."""
    load: dict[tuple[str, str], float] = defaultdict(float)
    for a, b, n in sends:
        ha, hb = spec.host_of_rank(a), spec.host_of_rank(b)
        if ha == hb:
            continue
        load[(f"host:{ha}", "up")] += n
        load[(f"host:{hb}", "down")] += n
        ra, rb = spec.rack_of_host(ha), spec.rack_of_host(hb)
        if ra != rb:
            load[(f"rack_uplink:{ra}", "up")] += n
            load[(f"rack_uplink:{rb}", "down")] += n
    return load


def busiest_s(loads: dict[tuple[str, str], float], rates: dict[str, float | None]) -> float:
    """Seconds the busiest (link, direction) needs at its rate (unshaped links are free)."""
    times = [n * 8 / (rates[link] * 1e6) for (link, _), n in loads.items() if rates.get(link)]
    return max(times, default=0.0)


def _step_sends(
    schedule: Schedule, t: int, n: int, nbytes: float, compressed: bool = False
) -> list[Send]:
    """What step ``t``'s groups send: a ring all-reduce of each group's slice of ``nbytes``, or
    with ``compressed`` the two stages of :func:`all_to_all` (the same for a pair)."""
    sends = all_to_all if compressed else ring_allreduce
    return [
        s
        for g in schedule.partition(t, n)
        for s in sends(g, nbytes * part_fraction(schedule.part(g, t, n)))
    ]


def schedule_bound(
    spec: ClusterSpec,
    schedule: Schedule,
    nbytes: float,
    steps: int,
    rates: dict[str, float | None],
    compressed: bool = False,
) -> float:
    """Per-step bound of a DS-Sync schedule: the busiest link's bytes over ``steps`` steps / rate / steps."""
    n = spec.world_size
    sends = [s for t in range(steps) for s in _step_sends(schedule, t, n, nbytes, compressed)]
    return busiest_s(link_loads(spec, sends), rates) / steps


def schedule_step_bound(
    spec: ClusterSpec,
    schedule: Schedule,
    nbytes: float,
    steps: int,
    rates: dict[str, float | None],
    compressed: bool = False,
) -> float:
    """Step bound of a DS-Sync schedule: each step's busiest link on its own, averaged.

    A step's groups run at once and each rank's next step waits on its group, so a step lasts at
    least as long as its busiest link needs. :func:`schedule_bound` lets a link's idle steps make
    up for its busy ones, which ranks held in step by their pairs cannot: where every step holds
    a whole-model pair on a 1 Gbit/s link (S2's spread crossings) this is that pair's time. It
    bounds ranks that keep in step, not strictly (a rank may run ahead of a slow pair).
    """
    n = spec.world_size
    per_step = [
        busiest_s(link_loads(spec, _step_sends(schedule, t, n, nbytes, compressed)), rates)
        for t in range(steps)
    ]
    return sum(per_step) / steps


def hierarchical_bound(spec: ClusterSpec, nbytes: float, rates: dict[str, float | None]) -> float:
    """Reduce in each domain (reduce-scatter + gather), ring all-reduce of leaders, broadcast back."""
    domains = spec.topology().domains()
    if len(domains) == 1:
        return busiest_s(link_loads(spec, ring_allreduce(domains[0], nbytes)), rates)
    reduce, bcast = [], []
    for d in domains:
        g = len(d)
        reduce += [(d[i], d[(i + 1) % g], (g - 1) / g * nbytes) for i in range(g)] if g > 1 else []
        reduce += [(r, d[0], nbytes / g) for r in d[1:]]
        bcast += [(d[0], r, nbytes / g) for r in d[1:]]
        bcast += [(d[i], d[(i + 1) % g], (g - 1) / g * nbytes) for i in range(g)] if g > 1 else []
    leaders = ring_allreduce([d[0] for d in domains], nbytes)
    return sum(busiest_s(link_loads(spec, phase), rates) for phase in (reduce, leaders, bcast))


def lower_bound(
    spec: ClusterSpec,
    method: str,
    nbytes: float,
    repeat: int = 8,
    rates: dict[str, float | None] | None = None,
    per_step: bool = False,
    compressed: bool = False,
) -> float | None:
    """Seconds per iteration that the link rates allow ``method`` at best (sync only).

    ``per_step``: a DS-Sync schedule's :func:`schedule_step_bound` instead of its bound over the
    cycle (the same for BSP and hierarchical, one phase pattern every step). ``compressed``: the
    method's wire is not fp32, so a group of three or more, the global average included, goes
    :func:`all_to_all` (a pair is the same either way). None for a method with no model here
    (its bound is not worked out).
    """
    bound = schedule_step_bound if per_step else schedule_bound
    rates = rates or spec.link_rates()
    m = get_method(method)
    plan = m.options.get("plan", "schedule")
    if m.name in ("bsp", "local-sgd") or plan == "global":  # one ring all-reduce of everything
        everyone = list(range(spec.world_size))
        sends = all_to_all if compressed and plan == "global" else ring_allreduce
        return busiest_s(link_loads(spec, sends(everyone, nbytes)), rates)
    if m.name == "hierarchical":
        return hierarchical_bound(spec, nbytes, rates)
    if m.preset and plan == "schedule" and m.settings.get("schedule", "shuffle") == "shuffle":
        return bound(spec, Shuffle(2, seed=0, repeat=repeat), nbytes, repeat, rates, compressed)
    if plan == "topology":
        topo = spec.topology()
        up = [v for k, v in rates.items() if k.startswith("rack_uplink")]
        topo = topo.with_rates(topo.host_mbit, up[0] if up else None)
        spread = m.options.get("spread", True)
        schedule = plan_topology_aware(topo, max_every=repeat, spread=spread)
        return bound(spec, schedule, nbytes, schedule.repeat, rates, compressed)
    return None
