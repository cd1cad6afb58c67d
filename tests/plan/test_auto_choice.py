"""--sync auto: the planner's pick from a topology, the model's size and the compute time."""

from __future__ import annotations

import pytest

from dssync.lab.cluster import load_cluster
from dssync.lab.plan.auto import CANDIDATES, SYNC_SHARE, canonical, choose, local_every
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
    light = choose(topo, MNIST_2048, compute_s=0.0005, local=False)  # nothing to hide behind
    assert light.method == "dssync-topo"
    heavy = choose(topo, MNIST_2048, compute_s=0.05, local=False)
    assert heavy.method == "dssync-topo-overlap" and "behind the compute" in heavy.reason


def test_local_steps_thin_the_averaging_and_every_1_leaves_them_out():
    topo = load_cluster("s1-homogeneous").topology()
    c = choose(topo, MNIST_2048, compute_s=0.017)
    by = {p.method: p for p in c.predictions}
    assert by["diloco"].sync_s == pytest.approx(by["ddp"].sync_s / 4)
    assert by["dssync-topo local"].sync_s == pytest.approx(by["dssync-topo"].sync_s / 4)
    assert c.method == "dssync-topo-local"
    assert c.every == local_every(by["dssync-topo"].sync_s, 0.017)
    assert f"one average every {c.every} steps" in c.reason
    every_step = choose(topo, MNIST_2048, compute_s=0.017, local=False)
    assert "diloco" not in {p.method for p in every_step.predictions}
    assert every_step.outer is None  # an average every step: no outer step
    assert every_step.method in {"dssync-topo", "dssync-topo-overlap", "dssync"}


def test_probe_noise_on_equal_links_does_not_make_slow_hosts():
    hosts = tuple(range(8))
    topo = Topology(hosts=hosts, racks=(0,) * 4 + (1,) * 4)
    noisy = topo.with_rates(
        {h: r for h, r in zip(hosts, (712, 1106, 905, 980, 801, 1003, 1090, 760), strict=True)},
        200.0,
    )
    spec, _ = canonical(noisy)
    assert spec.host_overrides == {}
    slow = topo.with_rates({h: (100.0 if h == 3 else 1000.0) for h in hosts}, 200.0)
    assert canonical(slow)[0].host_overrides == {3: 100.0}


@pytest.mark.parametrize("name", ["s1-homogeneous", "s4-dynamic", "tiny"])
def test_the_pick_is_the_fastest_prediction(name):
    c = choose(load_cluster(name).topology(), 400_000, compute_s=0.005)
    by = {p.method: p.iter_s for p in c.predictions}
    blocking = min(v for k, v in by.items() if "overlapped" not in k)
    if c.method == "dssync-topo-overlap":
        assert by["dssync-topo overlapped"] <= 0.8 * blocking
    else:
        planner = {m: name for name, m in CANDIDATES.items()}[c.method]
        assert by[planner] == blocking


def test_detected_hosts_in_any_order_become_the_canonical_shape():
    # torchrun may number hosts in any order: ranks 0-1 on rack 1, 2-3 on rack 0.
    topo = Topology(hosts=(3, 3, 0, 0), racks=(1, 1, 0, 0)).with_rates({3: 100.0, 0: 1000.0}, 50.0)
    spec, known = canonical(topo)
    assert (spec.racks, spec.hosts_per_rack, spec.workers_per_host) == (2, 1, 2)
    assert sorted(known.host_mbit.values()) == [100.0, 1000.0] and known.uplink_mbit == 50.0
    uneven = Topology(hosts=(0, 0, 1), racks=(0, 0, 0))
    assert canonical(uneven) is None
    assert choose(uneven, 1000, 0.01).method == "dssync-topo"


def test_the_local_candidates_average_as_often_as_their_presets():
    from dssync.lab.methods import get_method
    from dssync.lab.plan.auto import LOCAL

    for _, _, method, every in LOCAL:
        assert get_method(method).options["every"] == every


def test_a_local_step_pick_averages_as_rarely_as_keeps_averaging_under_a_share_of_compute():
    assert local_every(0.010, 0.018) == 4  # 2.5 ms a step against 4.5 ms allowed
    assert local_every(0.030, 0.018) == 8  # 7.5 ms at 4 is too much, 3.75 ms at 8 is not
    assert local_every(0.056, 0.018) == 16
    assert local_every(5.0, 0.018) == 16  # never within the share: the most the tables measure
    assert local_every(0.056, 0.0) is None  # compute unknown: the preset's own
    c = choose(load_cluster("s2-inter-rack").topology(), MNIST_2048, compute_s=0.018)
    assert (c.method, c.every) == ("dssync-topo-local", 16)
    assert "one average every 16 steps" in c.reason and "of the compute" in c.reason
    every_step = {p.method: p for p in c.predictions}["dssync-topo"]
    assert every_step.sync_s / 16 <= SYNC_SHARE * 0.018 < every_step.sync_s / 8


def test_a_given_every_is_what_the_pick_reports():
    c = choose(load_cluster("s2-inter-rack").topology(), MNIST_2048, compute_s=0.018, every=8)
    assert (c.method, c.every) == ("dssync-topo-local", 8)
    assert "one average every 8 steps: as --every says" in c.reason


def test_a_local_step_pick_applies_dilocos_outer_step_unless_outer_says_otherwise():
    topo = load_cluster("s2-inter-rack").topology()
    c = choose(topo, MNIST_2048, compute_s=0.018)
    assert (c.method, c.outer) == ("dssync-topo-local", "auto")  # none after Adam's steps
    assert "DiLoCo's outer Nesterov step at each average (none after Adam" in c.reason
    plain = choose(topo, MNIST_2048, compute_s=0.018, outer="none")
    assert plain.outer == "none" and "outer" not in plain.reason
    given = choose(topo, MNIST_2048, compute_s=0.018, outer="nesterov")
    assert "(as --outer says)" in given.reason


def test_the_report_labels_the_outer_step_only_where_it_is_not_the_methods_own():
    from dssync.lab.report.summary import picked

    pick = {"method": "dssync-topo-local", "every": 16, "outer": "nesterov"}
    assert picked(pick) == "dssync-topo-local:every=16:outer=nesterov"
    assert picked({**pick, "outer": "none"}) == "dssync-topo-local:every=16"
    assert picked({"method": "diloco", "every": 8, "outer": "auto"}) == "diloco:every=8"
    assert picked({"method": "diloco", "outer": "nesterov"}) == "diloco:outer=nesterov"
    assert picked({"method": "dssync-topo", "every": None}) == "dssync-topo"  # older files


def test_racks_of_equal_hosts_average_in_whole_racks_and_a_slow_host_keeps_pairs():
    from dssync.lab.plan.auto import rack_groups

    two_racks = choose(load_cluster("s2-inter-rack").topology(), MNIST_2048, compute_s=0.018)
    assert (two_racks.method, two_racks.group_size) == ("dssync-topo-local", 4)
    assert "groups of a whole rack (4: its hosts are equal)" in two_racks.reason
    assert choose(load_cluster("s3-slow-host").topology(), MNIST_2048, 0.018).group_size is None
    assert choose(load_cluster("s1-homogeneous").topology(), MNIST_2048, 0.018).group_size is None
    hosts = tuple(range(8))
    slow = Topology(hosts=hosts, racks=(0,) * 4 + (1,) * 4).with_rates(
        {h: (100.0 if h == 3 else 1000.0) for h in hosts}, 200.0
    )
    assert rack_groups(canonical(slow)[0]) is None  # the slow host would hold up its rack
    pairs_of_hosts = Topology(hosts=(0, 1, 2, 3), racks=(0, 0, 1, 1)).with_rates(
        dict.fromkeys(range(4), 1000.0), 200.0
    )
    assert rack_groups(canonical(pairs_of_hosts)[0]) is None  # a rack of two: pairs already


def test_a_given_group_size_is_what_the_pick_runs_and_says():
    topo = load_cluster("s2-inter-rack").topology()
    c = choose(topo, MNIST_2048, compute_s=0.018, group_size=2)
    assert c.group_size == 2 and "groups of 2 (as --group-size says)" in c.reason
    every_step = choose(topo, MNIST_2048, compute_s=0.018, local=False)
    assert every_step.group_size is None  # only a local-step pick takes whole racks


def test_the_report_labels_a_picked_group_size():
    from dssync.lab.report.summary import picked

    pick = {"method": "dssync-topo-local", "every": 16, "outer": "nesterov", "group_size": 4}
    assert picked(pick) == "dssync-topo-local:every=16:outer=nesterov:group-size=4"


def test_the_pick_fills_only_the_options_the_user_left_out():
    from dssync.lab.methods import configure, with_pick
    from dssync.lab.train import TrainConfig

    left_out = with_pick(TrainConfig(sync="auto"), "dssync-topo-local", 16, "nesterov", 4)
    assert (left_out.every, left_out.outer, left_out.group_size) == (16, "nesterov", 4)
    given = with_pick(
        TrainConfig(sync="auto", group_size=2, every=8), "dssync-topo-local", 16, None, 4
    )
    assert (given.every, given.group_size) == (8, 2)
    assert configure(TrainConfig(sync="dssync")).group_size == 2  # not given, no pick: pairs


def test_a_kept_pick_is_compared_by_what_it_ran_and_only_ds_sync_labels_a_group_size():
    from dssync.lab.report.summary import picked
    from dssync.lab.train.auto import Decision, _effective
    from dssync.topology import Topology

    kept = Decision("dssync-topo-local", "why", 0.01, Topology(hosts=(0, 1), racks=(0, 0)))
    # None is the method's own: --every 4 and --group-size 2 change nothing the run did
    assert (_effective(kept, "every"), _effective(kept, "group_size")) == (4, 2)
    assert _effective(kept, "outer") == "none"
    diloco = {"method": "diloco", "every": 16, "outer": "nesterov", "group_size": 4}
    assert picked({**diloco, "outer": "auto"}) == "diloco:every=16"  # no groups to size


def test_a_whole_rack_pick_sends_int8_over_a_slow_uplink_unless_wire_says_otherwise():
    from dssync.lab.methods import with_pick
    from dssync.lab.report.summary import picked
    from dssync.lab.train import TrainConfig
    from dssync.lab.train.auto import Decision, _effective

    s2 = load_cluster("s2-inter-rack").topology()
    c = choose(s2, MNIST_2048, compute_s=0.018)
    assert (c.group_size, c.wire) == (4, "int8") and "sent in int8" in c.reason
    assert choose(s2, MNIST_2048, compute_s=0.018, wire="fp32").wire is None  # given: it stands
    assert choose(s2, MNIST_2048, compute_s=0.018, group_size=2).wire is None  # pairs
    assert choose(load_cluster("s3-slow-host").topology(), MNIST_2048, 0.018).wire is None
    assert choose(s2, MNIST_2048, compute_s=0.018, local=False).wire is None
    s4 = choose(load_cluster("s4-dynamic").topology(), MNIST_2048, 0.018)  # uplink at host rate
    assert (s4.group_size, s4.wire) == (4, None) and "int8" not in s4.reason
    run = with_pick(TrainConfig(sync="auto"), c.method, c.every, c.outer, c.group_size, c.wire)
    assert run.wire == "int8"
    mine = with_pick(TrainConfig(sync="auto", wire="bf16"), c.method, None, None, 4, "int8")
    assert mine.wire == "bf16"
    pick = {"method": c.method, "every": 16, "outer": "nesterov", "group_size": 4, "wire": "int8"}
    assert picked(pick) == "dssync-topo-local:every=16:outer=nesterov:group-size=4:wire=int8"
    kept = Decision("dssync-topo-local", "why", 0.01, s2)  # from before auto picked the wire
    assert _effective(kept, "wire") == "fp32"


@pytest.mark.parametrize("name", ["s1-homogeneous", "s2-inter-rack", "s3-slow-host"])
def test_after_adam_auto_averages_every_step_in_the_optimizers_step(name):
    topo = load_cluster(name).topology()
    for compute_s in (0.017, 0.19):  # mnist's step here; lm's on 8 workers
        sgd = choose(topo, MNIST_2048, compute_s=compute_s)
        adam = choose(topo, MNIST_2048, compute_s=compute_s, adaptive=True)
        assert sgd.method.endswith("-local") or sgd.method in ("diloco", "dssync-topo-overlap")
        assert adam.method in {"dssync-topo", "dssync", "bsp", "hierarchical"}, adam.reason
        assert adam.every is None and adam.outer is None
        assert "after Adam-family steps: no local steps, no overlap" in adam.reason
    given = choose(topo, MNIST_2048, compute_s=0.017, adaptive=True, every=16)
    assert given.method.endswith("-local") or given.method == "diloco"  # --every 16 stands
    assert given.every == 16 and "no local steps" not in given.reason
