"""Build real namespaces and measure that tbf limits TCP throughput (needs root)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from cluster_helpers import assert_gone, netns_names

from dssync.lab.cluster import (
    Cluster,
    ClusterError,
    Scenario,
    diff,
    load_cluster,
    measure_mbit,
)
from dssync.lab.cluster.netns import remove_prefix
from dssync.lab.cluster.shaping import burst_bytes, current_rate_mbit

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]


def within(measured: float, configured: float, tolerance: float = 0.25) -> bool:
    return abs(measured - configured) <= tolerance * configured


def test_shaping_limits_throughput_and_routes_through_racks(two_racks):
    with Cluster(two_racks) as cluster:
        before = cluster.link_bytes()
        cross_rack = measure_mbit(cluster, 0, 2, nbytes=3_000_000)  # 50 Mbit/s uplink
        after_cross = cluster.link_bytes()
        slow_host = measure_mbit(cluster, 0, 1, nbytes=6_000_000)  # host 1 at 100
        fast = measure_mbit(cluster, 2, 3, nbytes=30_000_000)  # 1000 Mbit/s links
        moved_cross = diff(after_cross, before)
        moved_local = diff(cluster.link_bytes(), after_cross)
    print(
        f"measured: uplink 50 -> {cross_rack:.1f}, host 100 -> {slow_host:.1f}, "
        f"host 1000 -> {fast:.1f} Mbit/s"
    )
    assert within(cross_rack, 50), cross_rack
    assert within(slow_host, 100), slow_host
    assert fast > 4 * slow_host
    assert moved_cross["rack_uplink:0"].up >= 3_000_000
    assert moved_cross["host:2"].down >= 3_000_000
    assert moved_local["rack_uplink:0"].total < 100_000  # same-rack traffic stays in rack
    assert moved_local["host:1"].down >= 6_000_000


def test_set_rate_changes_throughput():
    with Cluster(load_cluster("tiny")) as cluster:
        slow = measure_mbit(cluster, 0, 1, nbytes=3_000_000)
        cluster.set_rate("rack_uplink", 150)
        assert current_rate_mbit(cluster.switch_ns, f"{cluster.prefix}u0") == pytest.approx(150)
        medium = measure_mbit(cluster, 1, 0, nbytes=8_000_000)
        cluster.set_rate("rack_uplink:0", None)
        cluster.set_rate("rack_uplink:1", None)
        unshaped = measure_mbit(cluster, 0, 1, nbytes=30_000_000)
        with pytest.raises(ClusterError, match="must be > 0"):
            cluster.set_rate("host:0", 0)
    print(f"measured: 50 -> {slow:.1f}, 150 -> {medium:.1f}, unshaped -> {unshaped:.1f} Mbit/s")
    assert within(slow, 50) and within(medium, 150)
    assert unshaped > 3 * medium


def test_down_removes_everything_even_after_an_exception(two_racks):
    cluster = Cluster(two_racks)
    with pytest.raises(RuntimeError, match="boom"), cluster:
        assert len([n for n in netns_names() if n.startswith(cluster.prefix)]) == 5
        raise RuntimeError("boom")
    assert_gone(cluster.prefix)
    cluster.down()
    assert remove_prefix(cluster.prefix) == []


def test_sigterm_inside_with_block_cleans_up():
    code = (
        "import sys, time\n"
        "from dssync.lab.cluster import Cluster, load_cluster\n"
        "with Cluster(load_cluster('tiny')) as c:\n"
        "    print(c.prefix, flush=True)\n"
        "    time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        prefix = proc.stdout.readline().strip()
        assert prefix.startswith("dss")
        assert any(n.startswith(prefix) for n in netns_names())
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    assert_gone(prefix)


def test_prefix_clash_leaves_the_existing_cluster_alone():
    spec = load_cluster("tiny")
    with Cluster(spec) as first:
        with pytest.raises(ClusterError, match="already exists"):
            Cluster(spec, prefix=first.prefix).up()
        assert any(n.startswith(first.prefix) for n in netns_names())
    assert_gone(first.prefix)


def test_burst_grows_with_rate():
    assert burst_bytes(10) == 32 * 1024
    assert burst_bytes(1000) == 500_000


def test_not_root_is_a_clear_error(monkeypatch):
    from dssync.lab.cluster import shell

    monkeypatch.setattr(shell.os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        Cluster(load_cluster("tiny")).up()
    monkeypatch.setattr(shell.shutil, "which", lambda tool: None)
    with pytest.raises(ClusterError, match="iproute2"):
        shell.require_root_and_tools()
    time.sleep(0)


def test_scenario_changes_a_live_cluster():
    spec = load_cluster("s4-dynamic")
    with Cluster(spec) as cluster:
        uplink = (cluster.switch_ns, f"{cluster.prefix}u1c")
        seen = []
        with Scenario(cluster.set_rate, spec.events, duration_s=3.0) as scenario:
            for _ in range(3):  # events fire at 1.0 s and 2.0 s; look at 0.5, 1.5 and 2.5 s
                time.sleep(0.5 if not seen else 1.0)
                seen.append(current_rate_mbit(*uplink))
        assert scenario.error is None and len(scenario.applied) == 2
        assert seen == [pytest.approx(1000), pytest.approx(100), pytest.approx(1000)]
