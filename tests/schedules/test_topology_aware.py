"""TopologyAware: racks cross along a hypercube, so every rack meets every other; crossings stay
narrow and rare, slow ranks rare, every partition valid."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

import dssync.schedules.topology
from dssync.errors import UsageError
from dssync.lab.plan.clusters import cluster_for
from dssync.lab.plan.consensus import _labels, connected, consensus_steps
from dssync.lab.plan.cost import topology_of
from dssync.schedules import check_partition
from dssync.schedules.topology import TopologyAware, crossing_pairs, plan_topology_aware


def racks(count: int, size: int) -> list[list[int]]:
    return [list(range(size * d, size * (d + 1))) for d in range(count)]


def home_of(schedule: TopologyAware) -> dict[int, int]:
    return {r: d for d, dom in enumerate(schedule.domains) for r in dom}


@pytest.mark.parametrize("workers", [64, 256])
def test_rack_cluster_reaches_consensus(workers):
    s = plan_topology_aware(topology_of(cluster_for("s2-inter-rack", workers)))
    assert len(s.domains) == workers // 4
    steps = consensus_steps(s, workers)
    # Racks along a ring needed 2,877 steps at 64 workers and 45,878 at 256; the hypercube grows
    # with log2 of the racks (769 and 1,153 when this was written).
    assert math.isfinite(steps) and steps < 2_000


@pytest.mark.parametrize("count", [2, 3, 5, 6, 8, 12])
def test_every_domain_count_connects(count):
    s = TopologyAware(racks(count, 3), cross_every=2)
    assert connected(_labels(s, 3 * count, s.cycle(3 * count)), 3 * count)
    assert math.isfinite(consensus_steps(s, 3 * count))


def test_whole_rack_crossings_agree_rack_means_in_log2_rounds():
    s = TopologyAware(racks(8, 4), cross_every=3, cross_pairs=4)
    x = np.random.default_rng(0).standard_normal(32)
    agree = []
    for t in range(9):  # crossing rounds at steps 0, 3, 6: log2(8) = 3 of them
        for g in s.partition(t, 32):
            x[g] = x[g].mean()
        means = x.reshape(8, 4).mean(axis=1)
        agree.append(bool(np.allclose(means, means.mean(), atol=1e-12)))
    assert agree == [False] * 6 + [True] * 3


@pytest.mark.parametrize("cross_pairs", [1, 2])
def test_crossings_stay_narrow_and_rare(cross_pairs):
    s = TopologyAware(racks(16, 4), cross_every=4, cross_pairs=cross_pairs, slow=[5, 22])
    home = home_of(s)
    seen = set()
    for t in range(2 * s.cycle(64)):
        per_pair: dict[tuple[int, int], int] = {}
        for g in s.crossings(t, 64):
            assert len(g) == 2
            pair = tuple(sorted({home[r] for r in g}))
            per_pair[pair] = per_pair.get(pair, 0) + 1
        if t % 4:
            assert not per_pair  # only every cross_every steps
        assert all(n <= cross_pairs for n in per_pair.values())
        assert all(n == cross_pairs for n in per_pair.values())  # and as wide as asked
        assert sum(1 for p in per_pair for d in p) == len({d for p in per_pair for d in p})
        seen |= set(per_pair)
    assert seen == {(d, d ^ (1 << k)) for d in range(16) for k in range(4) if d < d ^ (1 << k)}


@pytest.mark.parametrize(
    "schedule",
    [
        TopologyAware(racks(16, 4), slow=[3, 17, 40], slow_every=4, seed=1),
        TopologyAware(racks(5, 6), group_size=3, cross_every=2, cross_pairs=2, slow=[0]),
        TopologyAware([[0], [1, 2, 3], [4, 5]], cross_every=1, slow_every=2),
    ],
)
def test_every_partition_valid_and_repeating(schedule):
    n = schedule.world
    cycle = schedule.cycle(n)
    assert cycle == schedule.repeat and cycle % schedule.cross_every == 0
    for t in range(cycle):
        part = schedule.partition(t, n)
        check_partition(part, n)
        assert max(len(g) for g in part) <= max(schedule.group_size, 2)
        assert part == schedule.partition(t + cycle, n)


def test_slow_ranks_sync_once_every_slow_every_steps():
    s = TopologyAware(racks(8, 4), slow=[3, 9, 30], slow_every=4, cross_every=2)
    cycle = s.cycle(32)
    for r in s.slow:
        paired = [
            t for t in range(3 * cycle) if len(next(g for g in s.partition(t, 32) if r in g)) > 1
        ]
        assert paired and all(b - a >= 4 for a, b in zip(paired, paired[1:], strict=False))


def test_cycle_grows_with_log2_of_domains():
    assert [TopologyAware(racks(d, 2), cross_every=8).cycle(2 * d) for d in (1, 2, 3, 16, 256)] == [
        8,
        8,
        16,
        32,
        64,
    ]
    assert crossing_pairs(6, 2) == [(0, 4), (1, 5)]  # 2 and 3 have no partner in this round


def test_two_racks_plan_as_before_the_hypercube():
    # the pairs that crossed before racks met along a hypercube: measured 8-worker runs still hold
    s = TopologyAware(racks(2, 4), cross_every=1)
    assert [s.crossings(t, 8) for t in range(4)] == [[[3, 6]], [[3, 6]], [[3, 4]], [[3, 6]]]


def test_bad_settings_name_the_fix():
    with pytest.raises(UsageError, match="cross_pairs=-1 must be an integer >= 0"):
        TopologyAware(racks(2, 2), cross_pairs=-1)
    with pytest.raises(UsageError, match="cross_every=0 must be an integer >= 1"):
        TopologyAware(racks(2, 2), cross_every=0)


def test_docstring_examples():
    result = doctest.testmod(dssync.schedules.topology)
    assert result.attempted > 0 and result.failed == 0


def test_spread_crosses_one_slice_every_step_and_covers_the_model_each_cycle():
    s = TopologyAware(racks(2, 4), cross_every=8, spread=True)
    home = home_of(s)
    seen = []
    for t in range(16):
        p = s.partition(t, 8)
        check_partition(p, 8)
        cross = [g for g in p if len({home[r] for r in g}) > 1]
        assert len(cross) == 1  # one narrow crossing at every step, not one whole every 8
        seen.append(s.part(cross[0], t, 8))
        assert all(s.part(g, t, 8) == (0, 1) for g in p if g not in cross)
    assert sorted(seen[:8]) == [(i, 8) for i in range(8)] and seen[8:] == seen[:8]


def test_spread_keeps_the_bound_and_the_mixing_of_whole_crossings():
    from dssync.lab.bench.bounds import link_loads, ring_allreduce, schedule_bound
    from dssync.lab.cluster.spec import load_cluster
    from dssync.schedules.base import part_fraction

    spec = load_cluster("s2-inter-rack")
    whole = TopologyAware(racks(2, 4), cross_every=8)
    spread = TopologyAware(racks(2, 4), cross_every=8, spread=True)
    nbytes, rates = 16e6, spec.link_rates()

    def uplink_bytes(s):
        sends = [
            x
            for t in range(8)
            for g in s.partition(t, 8)
            for x in ring_allreduce(g, nbytes * part_fraction(s.part(g, t, 8)))
        ]
        return {k: v for k, v in link_loads(spec, sends).items() if "uplink" in k[0]}

    # The same bytes cross the uplink per cycle, spread over the steps; the bound is no higher.
    assert uplink_bytes(spread) == pytest.approx(uplink_bytes(whole))
    assert schedule_bound(spec, spread, nbytes, 8, rates) <= schedule_bound(
        spec, whole, nbytes, 8, rates
    )
    # Each coordinate crosses once a cycle, as with whole crossings: consensus within 20%.
    assert consensus_steps(spread, 8) <= 1.2 * consensus_steps(whole, 8)


def test_step_bound_counts_each_step_busiest_link():
    from dssync.lab.bench.bounds import lower_bound, schedule_bound, schedule_step_bound
    from dssync.lab.cluster.spec import load_cluster

    spec = load_cluster("s2-inter-rack")
    whole = TopologyAware(racks(2, 4), cross_every=8)
    spread = TopologyAware(racks(2, 4), cross_every=8, spread=True)
    nbytes, rates = 16e6, spec.link_rates()
    pair_s = nbytes * 8 / 1e9  # a whole-model pair on a 1 Gbit/s host link: 0.128 s
    # Spread: every step holds such a pair, so the step bound is its time, above the cycle's.
    assert schedule_step_bound(spec, spread, nbytes, 8, rates) == pytest.approx(pair_s)
    assert schedule_bound(spec, spread, nbytes, 8, rates) < pair_s
    # Whole crossings: seven steps of local pairs, one whose pair crosses the 200 Mbit/s uplink.
    crossing_s = nbytes * 8 / 200e6
    want = (7 * pair_s + crossing_s) / 8
    assert schedule_step_bound(spec, whole, nbytes, 8, rates) == pytest.approx(want)
    # One phase pattern every step: BSP's step bound is its bound.
    assert lower_bound(spec, "bsp", nbytes, per_step=True) == lower_bound(spec, "bsp", nbytes)


def test_spread_slow_rank_pairs_every_step_with_donors_in_turn():
    s = TopologyAware([list(range(8))], slow=[3], slow_every=8, spread=True)
    partners = set()
    for t in range(8):
        g = next(g for g in s.partition(t, 8) if 3 in g)
        assert len(g) == 2 and s.part(g, t, 8) == (t % 8, 8)
        partners.add(next(r for r in g if r != 3))
    assert len(partners) > 1  # a fixed donor would never mix its first slice with the others
    assert math.isfinite(consensus_steps(s, 8))


def test_spread_plans_faster_iterations_on_s2_and_s3():
    from dssync.lab.cluster.spec import load_cluster
    from dssync.lab.plan.cost import predict

    for name in ("s2-inter-rack", "s3-slow-host"):
        spec = load_cluster(name)
        topo = {
            spread: next(
                p for p in predict(spec, 4_000_000, spread=spread) if p.method == "dssync-topo"
            )
            for spread in (False, True)
        }
        assert topo[True].sync_s < 0.8 * topo[False].sync_s, name


def test_plans_spread_only_where_racks_keep_pairs_of_their_own():
    from dssync.topology import Topology

    def plan(rack_size):
        n = 2 * rack_size
        hosts = tuple(range(n))
        racks_ = tuple(r // rack_size for r in range(n))
        return plan_topology_aware(Topology(hosts=hosts, racks=racks_))

    assert plan(4).spread and not plan(2).spread
    assert math.isfinite(consensus_steps(plan(2), 4))
