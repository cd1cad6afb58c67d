"""Names and addresses of a cluster's pieces, and a cluster spec as a Topology (no root needed)."""

from __future__ import annotations

import pytest

from dssync.lab.cluster import ClusterError, ClusterNames, load_cluster


def test_names_follow_the_prefix_and_the_spec(two_racks):
    names = ClusterNames(two_racks, prefix="dss01")
    assert names.switch_ns == "dss01-sw"
    assert (names.host_ns(3), names.host_ifname(3), names.address_of(3)) == (
        "dss01-h3",
        "dss01h3",
        "10.213.0.4",
    )
    assert names.link_ends("host:1") == [("dss01-h1", "dss01h1"), ("dss01-sw", "dss01h1s")]
    assert names.link_ends("rack_uplink:1") == [("dss01-sw", "dss01u1"), ("dss01-sw", "dss01u1c")]
    assert ClusterNames(two_racks).prefix.startswith("dss")


def test_bad_prefix_and_missing_host_are_refused(two_racks):
    with pytest.raises(ClusterError, match="prefix 'Dss-1' is not valid; use 'dss'"):
        ClusterNames(two_racks, prefix="Dss-1")
    with pytest.raises(ValueError, match="host 4 does not exist"):
        ClusterNames(two_racks).host_ns(4)


def test_a_cluster_spec_is_its_own_topology(two_racks):
    topo = two_racks.topology()
    assert topo.hosts == (0, 1, 2, 3) and topo.racks == (0, 0, 1, 1)
    assert topo.host_mbit == {0: 1000.0, 1: 100.0, 2: 1000.0, 3: 1000.0}
    assert topo.uplink_mbit == 50.0 and topo.slow_hosts == (1,)
    one_rack = load_cluster("s1-homogeneous").topology()
    assert one_rack.uplink_mbit is None and one_rack.num_racks == 1
