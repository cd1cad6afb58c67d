"""--sync auto: the planner's pick from a topology, the model's size and the compute time."""

from __future__ import annotations

import pytest

from dssync.cluster import load_cluster
from dssync.plan.auto import canonical, choose
from dssync.topology import Topology

MNIST_2048 = 1_628_170  # parameters of `--workload mnist --workload-option hidden=2048`


@pytest.mark.parametrize("name", ["s2-inter-rack", "s3-slow-host"])
def test_a_bottlenecked_cluster_gets_topology_aware_ds_sync(name):
    c = choose(load_cluster(name).topology(), MNIST_2048, compute_s=0.017)
    assert c.method.startswith("dssync-topo")
    by = {p.method: p.iter_s for p in c.predictions}
    assert by["ddp"] > 3 * min(by.values())  # BSP's ring crosses the bottleneck every step
    assert c.reason.startswith(c.method + ": predicted") and "BSP's" in c.reason


def test_overlap_is_taken_only_when_it_saves_a_fifth():
    topo = load_cluster("s2-inter-rack").topology()
    light = choose(topo, MNIST_2048, compute_s=0.0005)  # nothing to hide the averaging behind
    assert light.method == "dssync-topo"
    heavy = choose(topo, MNIST_2048, compute_s=0.05)
    assert heavy.method == "dssync-topo-overlap" and "behind the compute" in heavy.reason


@pytest.mark.parametrize("name", ["s1-homogeneous", "s4-dynamic", "tiny"])
def test_the_pick_is_the_fastest_prediction(name):
    c = choose(load_cluster(name).topology(), 400_000, compute_s=0.005)
    by = {p.method: p.iter_s for p in c.predictions}
    blocking = min(v for k, v in by.items() if "overlapped" not in k)
    if c.method == "dssync-topo-overlap":
        assert by["dssync-topo overlapped"] <= 0.8 * blocking
    else:
        assert by[{"bsp": "ddp"}.get(c.method, c.method)] == blocking


def test_detected_hosts_in_any_order_become_the_canonical_shape():
    # torchrun may number hosts in any order: ranks 0-1 on rack 1, 2-3 on rack 0.
    topo = Topology(hosts=(3, 3, 0, 0), racks=(1, 1, 0, 0)).with_rates({3: 100.0, 0: 1000.0}, 50.0)
    spec, known = canonical(topo)
    assert (spec.racks, spec.hosts_per_rack, spec.workers_per_host) == (2, 1, 2)
    assert sorted(known.host_mbit.values()) == [100.0, 1000.0] and known.uplink_mbit == 50.0
    uneven = Topology(hosts=(0, 0, 1), racks=(0, 0, 0))
    assert canonical(uneven) is None
    assert choose(uneven, 1000, 0.01).method == "dssync-topo"
