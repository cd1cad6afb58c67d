"""The cost model on cases a person can check by hand, and against the link-rate lower bounds."""

from __future__ import annotations

import pytest

from dssync.lab.bench.bounds import lower_bound
from dssync.lab.cluster.spec import ClusterSpec, load_cluster
from dssync.lab.plan.cost import BYTES_PER_PARAM, predict, ring_s, schedule_s
from dssync.lab.plan.flows import GOODPUT, Net, Ring
from dssync.schedules import Butterfly, Static

LAT = 50e-6
MB = 1_000_000


def bps(mbit: float) -> float:
    return mbit * 1e6 / 8


def two_racks(uplink: float = 100.0) -> ClusterSpec:
    return ClusterSpec(
        "two",
        racks=2,
        hosts_per_rack=2,
        workers_per_host=1,
        host_rate_mbit=1000.0,
        rack_uplink_mbit=uplink,
    )


def test_two_hosts_one_slow_uplink_ring():
    net = Net(
        load_cluster("tiny"), latency_s=LAT, goodput=1.0
    )  # 2 hosts in 2 racks, 50 Mbit/s between
    n = 2
    expected = 2 * (n - 1) / n * MB / bps(50) + 2 * (n - 1) * 3 * LAT  # 3 switches between racks
    assert ring_s(net, MB) == pytest.approx(expected, rel=1e-9)


def test_ring_runs_at_the_slow_uplink_pace():
    net = Net(two_racks(100.0), latency_s=0.0, goodput=1.0)
    n = 4  # the ring 0-1-2-3 crosses each uplink once each way, so the uplink sets its pace
    assert ring_s(net, MB) == pytest.approx(2 * (n - 1) / n * MB / bps(100), rel=1e-9)


def test_pairs_crossing_one_uplink_share_it():
    net = Net(two_racks(100.0), latency_s=0.0, goodput=1.0)
    one = net.phase([Ring.allreduce([0, 2], MB)])
    two = net.phase([Ring.allreduce([0, 2], MB), Ring.allreduce([1, 3], MB)])
    local = net.phase([Ring.allreduce([0, 1], MB), Ring.allreduce([2, 3], MB)])
    assert one == pytest.approx(MB / bps(100))
    assert two == pytest.approx(2 * MB / bps(100))  # each pair gets half the uplink
    assert local == pytest.approx(MB / bps(1000))  # inside racks, host links only


def test_a_finished_flow_hands_its_share_on():
    net = Net(two_racks(100.0), latency_s=0.0, goodput=1.0)
    small, big = Ring.allreduce([0, 2], MB), Ring.allreduce([1, 3], 3 * MB)
    t_small, t_big = net.finish_times([small, big])
    assert t_small == pytest.approx(2 * MB / bps(100))  # half the uplink while both run
    assert t_big == pytest.approx(4 * MB / bps(100))  # then the whole uplink: (1 + 3) MB in all


def test_goodput_scales_every_link():
    full = Net(two_racks(100.0), latency_s=0.0, goodput=1.0)
    tcp = Net(two_racks(100.0), latency_s=0.0)
    assert ring_s(tcp, MB) == pytest.approx(ring_s(full, MB) / GOODPUT)


def test_slow_host_sets_the_ring_pace():
    spec = load_cluster("s3-slow-host")
    net = Net(spec, latency_s=0.0, goodput=1.0)
    n = spec.world_size
    assert ring_s(net, MB) == pytest.approx(2 * (n - 1) / n * MB / bps(100), rel=1e-9)


def test_compute_adds_and_overlap_takes_the_max():
    got = {p.method: p for p in predict(load_cluster("s2-inter-rack"), 1_000_000, compute_s=0.5)}
    for p in got.values():
        if p.method.endswith("overlapped"):
            assert p.iter_s == pytest.approx(max(0.5, p.sync_s))
        else:
            assert p.iter_s == pytest.approx(0.5 + p.sync_s)
    assert got["dssync-topo"].sync_s < got["ddp"].sync_s < got["dssync"].sync_s  # as S2 measures


@pytest.mark.parametrize("name", ["s1-homogeneous", "s2-inter-rack", "s3-slow-host", "s4-dynamic"])
def test_never_below_the_busiest_link_bound(name):
    spec = load_cluster(name)
    params = 2_000_000
    got = {p.method: p.sync_s for p in predict(spec, params)}
    for method in ("ddp", "hierarchical", "dssync", "dssync-topo"):
        bound = lower_bound(spec, method, BYTES_PER_PARAM * params, 8)
        assert got[method] >= bound * (1 - 1e-9), method
        assert got[method] <= bound * 6, method  # and not wildly above it


def test_ranks_wait_only_for_their_own_groups():
    spec = ClusterSpec(
        "one",
        racks=1,
        hosts_per_rack=4,
        workers_per_host=1,
        host_rate_mbit=1000.0,
        host_overrides={3: 100.0},
    )
    net = Net(spec, latency_s=0.0, goodput=1.0)
    fast, slow = MB / bps(1000), MB / bps(100)
    apart = Static([[0, 1], [2, 3]])  # the fast pair never meets the slow host
    assert schedule_s(net, apart, MB, compute_s=0.01) == pytest.approx((fast + slow) / 2, rel=1e-6)
    mixing = Butterfly(2)  # the slow host's pair changes, and its delay reaches everyone
    assert schedule_s(net, mixing, MB, compute_s=0.01) == pytest.approx(slow, rel=1e-6)


def test_host_cost_adds_per_byte_of_each_edge():
    plain = Net(two_racks(100.0), latency_s=0.0, goodput=1.0)
    busy = Net(two_racks(100.0), latency_s=0.0, goodput=1.0, host_s_per_byte=1e-9)
    n = 4
    assert ring_s(busy, MB) - ring_s(plain, MB) == pytest.approx(2 * (n - 1) / n * MB * 1e-9)
