"""Topology-aware division: groups stay behind fast links; crossings are planned, rare and narrow.

The paper's "bottleneck-free" division. At each step:

* every ``cross_every`` steps, domains (racks) cross in pairs along a hypercube: in crossing
  round k, domain d meets domain d XOR 2**k (see :func:`crossing_pairs`), ``cross_pairs`` pairs
  of ranks per pair of domains, so each uplink carries at most ``cross_pairs`` crossings;
* each slow rank joins a pair with a fast neighbour once every ``slow_every`` steps and is alone
  otherwise, so a slow host never sets the pace of the others;
* everyone else is shuffled into groups of ``group_size`` inside their own domain.

With ``spread=True`` a crossing's or a slow host's bytes are spread over the steps between two
full syncs instead of sent at once: every step one slice of the model crosses (slice ``step %
cross_every`` of ``cross_every``; a slow rank's pair takes slice ``(step + i) % slow_every`` of
``slow_every``), so each step's crossing costs 1/cross_every of a whole one and hides behind the
local pairs, where a whole crossing every ``cross_every`` steps stalls its pair, then the partners
that wait for it. Every coordinate still crosses once every ``cross_every`` steps, and each
step's mixing matrix is doubly stochastic for every coordinate. A rank in a crossing sits out
its rack's pairs for that step, so a rack needs three fast ranks or more for its own pairs to go
on mixing: :func:`plan_topology_aware` spreads only where every rack keeps at least one group
of its own beside its crossing ranks and its slow ranks' partners (racks of two would never mix
inside).

After log2 D crossing rounds every one of D domains has heard from every other (D a power of two;
otherwise a few more), so steps to consensus grow with log2 D, not with D as they would if racks
met along a ring.
The shuffle inside a domain cycles ``local_repeat`` partitions, so the pattern repeats every
``repeat`` = lcm(cross_every * ceil(log2 D), slow_every, local_repeat)
steps (finite, growing with log2 D: 32 steps for 16 racks, 64 for 256 with crossings every 8), so
all its groups can be created up front, and it depends only on (step, world size, settings), so
every rank computes the same partition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dssync.errors import UsageError
from dssync.schedules.base import (
    Part,
    Partition,
    Schedule,
    canonical,
    check_group_size,
    split_even,
)

# Whether plans spread crossings and slow hosts' syncs over the steps (TopologyAware's spread).
SPREAD = True
# A crossing may add at most this fraction of a local sync's time per step, amortized.
CROSSING_BUDGET = 0.25


class TopologyAware(Schedule):
    """Groups inside ``domains`` (lists of ranks, e.g. racks); planned crossings; slow ranks rare.

    How wide a crossing should be is a trade-off. One pair (the default) moves 1/(2m) of the
    difference between two racks of m ranks, so the racks' means agree only after several sweeps
    of the hypercube; ``cross_pairs`` = m pairs every member of a rack with one of the other and
    the racks' means agree exactly after log2 D rounds (D a power of two), but each crossing then
    shares the uplink m ways. The planner's model (:mod:`dssync.lab.plan`, 4M parameters, 50 ms
    compute, s2-inter-rack: racks of 4 behind 200 Mbit/s uplinks, crossings every 8 steps) at 64
    workers predicts:

    ==========================  ==================  ================
    crossing                    steps to 1e-3       ms per iteration
    ==========================  ==================  ================
    1 pair (default)            769                 251
    2 pairs                     322                 335
    4 pairs (whole rack)        32                  502
    1 pair every 2 steps        209                 452
    ==========================  ==================  ================

    (1,153 / 482 / 48 steps for 1, 2, 4 pairs at 256 workers; 1,537 / 638 / 64 at 1,024; the
    iteration time does not change with the number of racks.) These are whole crossings
    (``spread=False``); one pair spread over the 8 steps mixes alike (766 steps) at 178 ms.
    Wide and rare beats narrow and often for mixing; narrow keeps each step's traffic within a
    slow uplink, which is what this schedule is for, so one pair stays the default; pass
    ``cross_pairs`` = rack size to trade iteration time for mixing. With D not a power of two
    some domains sit some rounds out and mixing is slower (5 racks of 4: 1,395 steps with one
    pair).

    Example::

        >>> s = TopologyAware([[0, 1, 2, 3], [4, 5, 6, 7]], cross_every=4, slow=[7], slow_every=2)
        >>> s.partition(1, 8)
        [[0, 2], [1, 3], [4, 6], [5], [7]]
        >>> crossing_pairs(8, 2)  # the racks that cross in the third crossing round
        [(0, 4), (1, 5), (2, 6), (3, 7)]
    """

    # The topology and settings a plan was made from: probed rates differ on every run, so a
    # resumed run's new probe must not make the same plan look like another one.
    UNDESCRIBED = ("planned_from",)

    def __init__(
        self,
        domains: Sequence[Sequence[int]],
        group_size: int = 2,
        cross_every: int = 4,
        cross_pairs: int = 1,
        slow: Sequence[int] = (),
        slow_every: int = 4,
        seed: int = 0,
        local_repeat: int = 8,
        spread: bool = False,
    ) -> None:
        check_group_size(group_size)
        for name, value in (
            ("cross_every", cross_every),
            ("slow_every", slow_every),
            ("local_repeat", local_repeat),
        ):
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"{name}={value!r} must be an integer >= 1 (steps); e.g. 8")
        if not isinstance(cross_pairs, int) or cross_pairs < 0:
            raise UsageError(
                f"cross_pairs={cross_pairs!r} must be an integer >= 0; use 1 for one narrow crossing"
            )
        self.domains = tuple(tuple(sorted(int(r) for r in d)) for d in domains if len(d))
        self.group_size = group_size
        self.cross_every = cross_every
        self.cross_pairs = cross_pairs
        self.slow = tuple(sorted(int(r) for r in slow))
        self.slow_every = slow_every
        self.seed = seed
        self.spread = bool(spread)
        self.planned_from = None  # (topology, planner settings) when plan_topology_aware made it
        self._home = {r: d for d, dom in enumerate(self.domains) for r in dom}
        self.rounds = max(1, (len(self.domains) - 1).bit_length())  # crossing rounds per sweep
        self.repeat = math.lcm(cross_every * self.rounds, slow_every, local_repeat)

    @property
    def world(self) -> int:
        return sum(len(d) for d in self.domains)

    def cycle(self, world_size: int) -> int | None:
        return self.repeat

    def partition(self, step: int, world_size: int) -> Partition:
        if world_size != self.world:
            raise UsageError(
                f"this TopologyAware schedule was planned for {self.world} ranks, not {world_size}; "
                "plan it from the topology of this run (dssync.schedules.plan_topology_aware)"
            )
        key = step % self.repeat
        slow = set(self.slow)
        pools = [[r for r in d if r not in slow] for d in self.domains]
        groups: list[list[int]] = []
        rng = np.random.default_rng([self.seed, key])
        if self.spread or key % self.cross_every == 0:
            event = key // self.cross_every
            for pair in crossing_pairs(len(pools), event % self.rounds):
                for i in range(min(self.cross_pairs, *(len(pools[d]) for d in pair))):
                    # the racks take turns to draw first (two racks plan as they always have)
                    turn = pair if (event * self.cross_pairs + i) % 2 == 0 else pair[::-1]
                    groups.append([_take(pools[d], int(rng.integers(len(pools[d])))) for d in turn])
        for i, r in enumerate(self.slow):
            home = next(d for d, dom in enumerate(self.domains) if r in dom)
            if self.spread or (key + i) % self.slow_every == 0:
                donor = home if pools[home] else max(range(len(pools)), key=lambda d: len(pools[d]))
                if pools[donor]:
                    turn = key if self.spread else key // self.slow_every  # donors take turns
                    groups.append([r, _take(pools[donor], turn + i)])
                    continue
            groups.append([r])
        for pool in pools:
            if self.group_size == 2:
                groups += _round_robin_pairs(pool, key, self.seed)
            elif pool:
                groups += split_even([int(r) for r in rng.permutation(pool)], self.group_size)
        return canonical(groups)

    def part(self, group: list[int], step: int, world_size: int) -> Part:
        """With ``spread``, a crossing or slow group's slice of the model; else all of it."""
        if not self.spread:
            return (0, 1)
        key = step % self.repeat
        for i, r in enumerate(self.slow):
            if r in group:
                return ((key + i) % self.slow_every, self.slow_every)
        if len({self._home[r] for r in group}) > 1:
            return (key % self.cross_every, self.cross_every)
        return (0, 1)

    def crossings(self, step: int, world_size: int) -> list[list[int]]:
        """The groups of ``step`` that span more than one domain."""
        return [g for g in self.partition(step, world_size) if len({self._home[r] for r in g}) > 1]


def crossing_pairs(domains: int, round_: int) -> list[tuple[int, int]]:
    """The domains that cross in crossing round ``round_``: d with d XOR 2**round_ (a hypercube).

    A matching: each domain crosses with at most one other per round, so each uplink carries only
    its own domain's crossing pairs. With a number of domains that is not a power of two, a domain
    whose partner does not exist sits the round out; the rounds still join every domain (clearing
    bits one at a time leads from any domain to domain 0 without leaving the range).

    Example::

        >>> crossing_pairs(4, 0), crossing_pairs(4, 1), crossing_pairs(3, 1)
        ([(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 2)])
    """
    bit = 1 << round_
    return [(d, d ^ bit) for d in range(domains) if d < d ^ bit < domains]


def _take(pool: list[int], turn: int) -> int:
    """Remove and return the member at position ``turn`` (mod the pool's size)."""
    return pool.pop(turn % len(pool))


def _round_robin_pairs(pool: list[int], key: int, seed: int) -> list[list[int]]:
    """Round ``key`` of a round-robin over ``pool`` (circle method): every pair meets in turn."""
    order = [int(r) for r in np.random.default_rng(seed).permutation(pool)] if seed else list(pool)
    if len(order) % 2:
        order.append(-1)  # sits out
    n = len(order)
    if n < 2:
        return [[r] for r in order if r >= 0]
    shift = key % (n - 1)
    rest = order[1:]
    ring = [order[0], *(rest[-shift:] + rest[:-shift] if shift else rest)]
    groups = []
    for i in range(n // 2):
        pair = [r for r in (ring[i], ring[n - 1 - i]) if r >= 0]
        groups += [pair] if len(pair) == 2 else [[r] for r in pair]
    return groups


def every_for(ratio: float, cap: int) -> int:
    """How rarely to take a sync that costs ``ratio`` times a local one: a power of two <= cap.

    The extra cost (ratio - 1) spread over the steps in between stays within CROSSING_BUDGET.
    """
    extra = ratio - 1.0
    every = 1
    while extra / every > CROSSING_BUDGET and every < cap:
        every *= 2
    return min(every, cap)


def oversubscribed(topology) -> bool:
    """Whether some rack's hosts together can send more than its uplink carries (its rate, as
    given or probed: a probe that times one flow reads an uplink as about one host's link)."""
    local = topology.local_mbit() or 0.0
    racks: dict[int, set[int]] = {}
    for h, k in zip(topology.hosts, topology.racks, strict=True):
        racks.setdefault(k, set()).add(h)
    return any(
        sum(topology.host_mbit.get(h, local) for h in hosts) > topology.uplink_mbit
        for hosts in racks.values()
    )


# The longest gap between crossings (in averagings) of a plan that is not re-planned; a
# re-planned one uses its re-plan period (``replan=``).
DEFAULT_MAX_EVERY = 8


def plan_topology_aware(
    topology,
    group_size: int = 2,
    seed: int = 0,
    max_every: int = DEFAULT_MAX_EVERY,
    cross_pairs: int = 1,
    spread: bool = SPREAD,
    min_every: int | None = None,
) -> TopologyAware:
    """The schedule for a :class:`dssync.topology.Topology`: domains, crossing and slow-host pace.

    With known rates, crossings happen every ``every_for(local / (uplink / cross_pairs))`` steps
    and slow hosts sync every ``every_for(local / slow host rate)`` steps (powers of two, at most
    ``max_every``, so an adjustment window of ``max_every`` steps sees a crossing and a slow
    host's sync). Without rates, crossings happen every ``max(max_every // 2, min_every)``
    steps. Where the plan spreads its crossings over an :func:`oversubscribed` uplink,
    ``min_every`` (default ``max_every // 2``) is also the least gap when the uplink measures
    as fast as a host link (a slice
    of the model crosses at every step): an uplink is shared with whatever else crosses the racks
    and a probe sees only the present, so when the uplink slows a step pays for one slice, not
    the whole model, while a fast uplink carries the slices behind the local pairs. (S4, the
    uplink 10x slower for a third of the run: ``--sync auto``, planned from a probe that saw the
    uplink fast, took 3.1 s to the target when it crossed whole at every step, 1.8 s with the
    least gap, as the preset; docs/reliability.md.) It costs mixing: on S4's shape steps to
    consensus grow about 3x (docs/planner.md). Pass ``min_every=1`` for an uplink no other
    traffic shares; a non-blocking one (as fast as its rack's hosts together) needs no guard. Each crossing
    round pairs racks along a hypercube (see :class:`TopologyAware`), ``cross_pairs`` pairs of
    ranks per pair of racks; the plan repeats every ``max_every * ceil(log2 racks)`` steps or so.

    Example::

        >>> from dssync.topology import Topology
        >>> topo = Topology(hosts=tuple(range(16)), racks=tuple(r // 4 for r in range(16)))
        >>> s = plan_topology_aware(topo)
        >>> s.cross_every, s.rounds, s.cycle(16)
        (4, 2, 8)
    """
    local = topology.local_mbit()
    least = max(max_every // 2, 1) if min_every is None else min_every
    if not isinstance(least, int) or not 1 <= least <= max_every:
        raise UsageError(
            f"min_every={min_every!r} must be an integer from 1 to max_every={max_every}; "
            "e.g. 1 for an uplink no other traffic shares"
        )
    slow = topology.slow_ranks
    domains = topology.domains()
    # Spread only where each rack keeps a pair of its own beside its crossings and slow donors.
    crossing = cross_pairs if len(domains) > 1 else 0
    left = [
        len([r for r in d if r not in slow]) - crossing - len([r for r in d if r in slow])
        for d in domains
    ]
    asked = {"group_size": group_size, "seed": seed, "max_every": max_every}
    asked |= {"cross_pairs": cross_pairs, "spread": spread, "min_every": min_every}
    spread = spread and min(left) >= group_size
    if local and topology.uplink_mbit:
        ratio = local / (topology.uplink_mbit / max(cross_pairs, 1))
        # the least gap guards slices over a shared uplink; a whole crossing, or one over an
        # uplink that carries all its rack's hosts at once, is taken as often as the rate allows
        guarded = spread and oversubscribed(topology)
        cross_every = max(every_for(ratio, max_every), least if guarded else 1)
    else:
        cross_every = max(max_every // 2, least, 1)
    slow_rates = [topology.host_mbit[h] for h in topology.slow_hosts if h in topology.host_mbit]
    slow_every = (
        every_for(local / min(slow_rates), max_every)
        if slow and local and slow_rates
        else max_every
    )
    plan = TopologyAware(
        domains,
        group_size=group_size,
        cross_every=cross_every,
        cross_pairs=cross_pairs,
        slow=slow,
        slow_every=slow_every,
        seed=seed,
        local_repeat=max_every,
        spread=spread,
    )
    plan.planned_from = (topology, asked)  # what a re-plan repeats with new rates (DSSync replan=)
    return plan
