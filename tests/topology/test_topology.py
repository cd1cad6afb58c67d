"""Topology values, detection from the launcher's environment, the probe plan, and TopologyAware."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from dssync.errors import UsageError
from dssync.lab.cluster import load_cluster
from dssync.lab.launch import spawn
from dssync.schedules import check_partition, spectral_gap
from dssync.schedules.topology import (
    TopologyAware,
    every_for,
    oversubscribed,
    plan_topology_aware,
)
from dssync.topology import Topology, detect, from_env, probe_pairs
from dssync.topology.probe import infer_rates

S2 = load_cluster("s2-inter-rack").topology()
S3 = load_cluster("s3-slow-host").topology()


def test_from_spec_and_domains():
    assert S2.hosts == tuple(range(8)) and S2.racks == (0,) * 4 + (1,) * 4
    assert S2.uplink_mbit == 200 and S2.domains() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert S3.slow_hosts == (3,) and S3.domains() == [list(range(8))]
    two_hosts = Topology(hosts=(0, 0, 1, 1), racks=(0,) * 4)
    assert two_hosts.domains() == [[0, 1], [2, 3]]


def test_from_env_blocks_of_local_world_size():
    assert from_env(6, {"LOCAL_WORLD_SIZE": "3"}).hosts == (0, 0, 0, 1, 1, 1)
    with pytest.raises(UsageError, match="does not divide"):
        from_env(5, {"LOCAL_WORLD_SIZE": "2"})


def _detect_per_rank():
    import os

    rank = dist.get_rank()
    os.environ["DSSYNC_HOST"] = str(10 + rank // 2)
    os.environ["DSSYNC_RACK"] = str(rank // 2)
    return detect(), detect(probe=True, probe_bytes=64_000, probe_rounds=3, timeout_s=30)


def test_detect_from_cluster_env_and_probe_on_gloo():
    out = spawn(_detect_per_rank, 4, timeout_s=90)
    assert all(t == Topology(hosts=(0, 0, 1, 1), racks=(0, 0, 1, 1)) for t, _ in out)
    probed = [p for _, p in out]
    # pairs inside a host say nothing of links; the crossing pairs give the uplink, alike everywhere
    assert probed[0].host_mbit == {} and probed[0].uplink_mbit > 0
    assert all(p == probed[0] for p in probed)


def test_probe_pairs_are_disjoint_and_cover_everyone():
    plan = probe_pairs(8, 7)
    assert len(plan) == 7
    seen = set()
    for pairs in plan:
        ranks = [r for p in pairs for r in p]
        assert sorted(ranks) == list(range(8))
        seen |= set(pairs)
    assert len(seen) == 28  # every pair once
    assert all(len({r for p in pairs for r in p}) == 2 * len(pairs) for pairs in probe_pairs(5, 9))


def test_infer_rates_finds_slow_host_and_slow_uplink():
    topo = Topology(hosts=tuple(range(8)), racks=(0,) * 4 + (1,) * 4)
    plan = probe_pairs(8, 7)
    rates = []
    for pairs in plan:
        crossing = sum(topo.racks[a] != topo.racks[b] for a, b in pairs)
        row = [0.0] * 8
        for a, b in pairs:
            v = 200 / crossing if topo.racks[a] != topo.racks[b] else 1000.0
            if 2 in (a, b):
                v = min(v, 100.0)
            row[a] = row[b] = v
        rates.append(row)
    est = infer_rates(topo, plan, rates)
    assert est.slow_hosts == (2,)
    assert est.uplink_mbit is not None and est.uplink_mbit < 250


@pytest.mark.parametrize("topo", [S2, S3, load_cluster("s4-dynamic").topology()])
def test_topology_aware_covers_ranks_and_mixes(topo):
    s = plan_topology_aware(topo)
    for t in range(2 * s.repeat):
        check_partition(s.partition(t, 8), 8)
    assert s.cycle(8) == s.repeat
    assert spectral_gap(s, 8, steps=s.repeat) > 0.01
    assert s.partition(3, 8) == plan_topology_aware(topo).partition(3 + s.repeat, 8)


def test_crossings_are_rare_and_narrow():
    whole = plan_topology_aware(S2, spread=False)
    crossings = [whole.crossings(t, 8) for t in range(whole.repeat)]
    assert whole.cross_every == 8
    assert sum(1 for c in crossings if c) == 1  # once per cycle
    assert all(len(c) <= 1 and all(len(g) == 2 for g in c) for c in crossings)  # one pair
    spread = plan_topology_aware(S2)  # the default: a slice of the model crosses every step
    parts = []
    for t in range(spread.repeat):
        (g,) = spread.crossings(t, 8)  # one pair at every step
        assert len(g) == 2
        parts.append(spread.part(g, t, 8))
    assert sorted(parts) == [(i, 8) for i in range(8)]  # one whole model per cycle


def test_a_fast_uplink_still_carries_slices_not_the_whole_model():
    s4 = load_cluster("s4-dynamic").topology()  # uplink as fast as a host link, before its drop
    plan = plan_topology_aware(s4)
    assert plan.cross_every == 4 and plan.spread  # the least gap, max_every // 2
    parts = [plan.part(g, t, 8) for t in range(4) for g in plan.crossings(t, 8)]
    assert sorted(parts) == [(i, 4) for i in range(4)]  # a quarter of the model at each step
    assert plan_topology_aware(s4, min_every=1).cross_every == 1  # an uplink nobody else uses
    assert plan_topology_aware(S2).cross_every == 8  # a slow uplink: the rate decides, as before
    unknown = Topology(hosts=tuple(range(8)), racks=S2.racks)
    assert plan_topology_aware(unknown, min_every=1).cross_every == 4  # no rates: max_every // 2
    pairs = Topology(  # racks of two cannot spread: a whole crossing as often as the rate allows
        hosts=(0, 1, 2, 3),
        racks=(0, 0, 1, 1),
        host_mbit=dict.fromkeys(range(4), 1000.0),
        uplink_mbit=1000.0,
    )
    assert not plan_topology_aware(pairs).spread and plan_topology_aware(pairs).cross_every == 1
    wide = s4.with_rates(s4.host_mbit, 4000.0)  # non-blocking: the rack's 4 hosts at once
    assert not oversubscribed(wide) and oversubscribed(s4)
    assert plan_topology_aware(wide).cross_every == 1  # nothing else shares it: no guard
    with pytest.raises(UsageError, match="min_every=16 must be an integer from 1 to max_every=8"):
        plan_topology_aware(s4, min_every=16)


def test_slow_host_syncs_rarely_in_pairs():
    whole = plan_topology_aware(S3, spread=False)
    groups = [next(g for g in whole.partition(t, 8) if 3 in g) for t in range(whole.repeat)]
    assert whole.slow == (3,) and whole.slow_every == 8
    assert sum(len(g) > 1 for g in groups) == 1 and max(len(g) for g in groups) == 2
    spread = plan_topology_aware(S3)
    groups = [next(g for g in spread.partition(t, 8) if 3 in g) for t in range(spread.repeat)]
    assert all(len(g) == 2 for g in groups)  # a pair at every step, an eighth of the model each
    assert sorted(spread.part(g, t, 8) for t, g in enumerate(groups)) == [(i, 8) for i in range(8)]


def test_every_for_and_describe():
    assert [every_for(r, 8) for r in (1.0, 1.2, 2.0, 5.0, 50.0)] == [1, 1, 4, 8, 8]
    a = TopologyAware([[0, 1], [2, 3]], cross_every=2)
    assert "cross_every=2" in a.describe()
    assert a.fingerprint(4) != TopologyAware([[0, 1], [2, 3]], cross_every=4).fingerprint(4)
    with pytest.raises(ValueError, match="planned for 4 ranks"):
        a.partition(0, 6)
