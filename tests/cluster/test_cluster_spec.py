from __future__ import annotations

import pytest

from dssync.lab.cluster import ClusterSpecError, load_cluster, parse_cluster, shipped_clusters
from dssync.lab.cluster.scenario import plan

GOOD = """
name = "t"
[cluster]
racks = 2
hosts_per_rack = 2
workers_per_host = 2
host_rate_mbit = 1000
rack_uplink_mbit = 200
"""


def test_shipped_files_load():
    assert {"s1-homogeneous", "s2-inter-rack", "s3-slow-host", "s4-dynamic", "tiny"} <= set(
        shipped_clusters()
    )
    for name in shipped_clusters():
        spec = load_cluster(name)
        assert spec.name == name
        assert spec.world_size == spec.num_hosts * spec.workers_per_host


def test_shipped_scenarios_match_the_brief():
    s1 = load_cluster("s1-homogeneous")
    assert (s1.num_hosts, s1.has_core, set(s1.link_rates().values())) == (8, False, {1000.0})
    s2 = load_cluster("s2-inter-rack")
    assert s2.racks == 2 and s2.hosts_per_rack == 4 and s2.uplink_rate(1) == 200
    s3 = load_cluster("s3-slow-host")
    assert [s3.host_rate(h) for h in range(8)].count(100) == 1
    s4 = load_cluster("s4-dynamic")
    steps = plan(s4.events, duration_s=90)
    assert [(round(s.at_s), s.rate_mbit) for s in steps] == [(30, 100), (60, 1000)]


def test_load_by_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    assert load_cluster(path).world_size == 8
    assert load_cluster(str(path)).source == str(path)


def test_rank_host_rack_mapping():
    spec = parse_cluster(GOOD)
    assert [spec.host_of_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [spec.rack_of_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert spec.local_rank(5) == 1
    assert spec.ranks_in_rack(1) == [4, 5, 6, 7]
    assert spec.link_rates()["rack_uplink:1"] == 200
    assert spec.expand_link("rack_uplink") == ["rack_uplink:0", "rack_uplink:1"]
    assert spec.expand_link("host:3") == ["host:3"]
    with pytest.raises(ClusterSpecError, match="rank 8 does not exist"):
        spec.host_of_rank(8)


BAD = [
    ("[cluster]\nracks = 1\n", "missing hosts_per_rack"),
    ("name = 'x'\n", "missing \\[cluster\\]"),
    (GOOD.replace("host_rate_mbit = 1000", "host_rate_mbit = -5"), "positive number"),
    (GOOD.replace("host_rate_mbit = 1000", "host_rate_mbit = 0"), "positive number"),
    (GOOD.replace("host_rate_mbit = 1000", "host_rate_mbit = '1000'"), "positive number"),
    (GOOD.replace("racks = 2", "racks = 2.5"), "positive integer"),
    (GOOD.replace("racks = 2", "racks = true"), "positive integer"),
    (GOOD.replace("racks = 2", "rack = 2"), "unknown key 'rack'"),
    (GOOD + "[[host_override]]\nhost = 4\nrate_mbit = 10\n", "use an index in 0..3"),
    (GOOD + "[[host_override]]\nhost = 1\n", "missing rate_mbit"),
    (GOOD + "[[event]]\nat_s = 1\nlink = 'rack_uplink:2'\nrate_mbit = 5\n", "does not exist"),
    (GOOD + "[[event]]\nat_s = 1\nlink = 'spine'\nrate_mbit = 5\n", "unknown link 'spine'"),
    (GOOD + "[[event]]\nlink = 'host:1'\nrate_mbit = 5\n", "exactly one of at_s or at_fraction"),
    (GOOD + "[[event]]\nat_fraction = 1.5\nlink = 'host:1'\nrate_mbit = 5\n", "between 0 and 1"),
    ("[cluster]\nhosts_per_rack = 2\nhost_rate_mbit = 1\nrack_uplink_mbit = 5\n", "racks = 1"),
    ("[cluster\n", "not valid TOML"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_bad_input_names_problem_and_file(text, message):
    with pytest.raises(ClusterSpecError, match=message) as info:
        parse_cluster(text, source="bad.toml")
    text = str(info.value)
    assert text.startswith("bad.toml") and "\n" not in text
    assert isinstance(info.value, ValueError)


def test_unknown_name_lists_shipped():
    with pytest.raises(ClusterSpecError, match="s2-inter-rack"):
        load_cluster("no-such-topology")


def test_fraction_event_needs_duration():
    spec = load_cluster("s4-dynamic")
    with pytest.raises(ClusterSpecError, match="duration"):
        plan(spec.events)
