"""Scaled shipped topologies and generated fabrics have the shapes they promise."""

from __future__ import annotations

import pytest

from dssync.errors import UsageError
from dssync.lab.cluster.spec import parse_cluster
from dssync.lab.plan.clusters import cluster_for, fat_tree, rack_spine, to_toml


def test_scaling_keeps_rack_size_and_rates():
    spec = cluster_for("s2-inter-rack", 1024)
    assert (spec.world_size, spec.racks, spec.hosts_per_rack) == (1024, 256, 4)
    assert (spec.host_rate_mbit, spec.rack_uplink_mbit) == (1000.0, 200.0)


def test_scaling_repeats_slow_hosts_per_block():
    spec = cluster_for("s3-slow-host", 64)
    assert spec.racks == 8
    assert spec.host_overrides == {3 + 8 * k: 100.0 for k in range(8)}


def test_scaling_rejects_a_partial_rack():
    with pytest.raises(UsageError, match="not a multiple of 4.*use 8 or 12"):
        cluster_for("s2-inter-rack", 10)


@pytest.mark.parametrize("n", [64, 256, 1024])
def test_fat_tree_is_non_blocking(n):
    spec = fat_tree(n, ports=16, host_mbit=25_000)
    assert spec.world_size == n and spec.hosts_per_rack == 8 and spec.racks == n // 8
    assert spec.rack_uplink_mbit == 8 * 25_000


def test_fat_tree_too_big_for_its_switches():
    with pytest.raises(UsageError, match="ports >= 32"):
        fat_tree(2048, ports=16)


@pytest.mark.parametrize("n", [64, 256, 1024])
def test_rack_spine_is_oversubscribed(n):
    spec = rack_spine(n, hosts_per_rack=16, host_mbit=25_000, oversubscription=4)
    assert spec.world_size == n and spec.racks == n // 16
    assert spec.rack_uplink_mbit == 16 * 25_000 / 4


def test_written_topology_reads_back():
    for spec in (cluster_for("s3-slow-host", 64), cluster_for("s4-dynamic", 256), fat_tree(128)):
        back = parse_cluster(to_toml(spec))
        assert back.world_size == spec.world_size
        assert back.link_rates() == spec.link_rates()
        assert back.events == spec.events


def test_unknown_name_names_the_choices():
    with pytest.raises(UsageError, match="s2-inter-rack.*fat-tree"):
        cluster_for("no-such-cluster")


def test_a_generated_fat_tree_grows_its_switches_past_1024_workers():
    assert cluster_for("fat-tree", 1024).hosts_per_rack == 8
    big = cluster_for("fat-tree", 2048)
    assert big.world_size == 2048 and big.hosts_per_rack == 16
