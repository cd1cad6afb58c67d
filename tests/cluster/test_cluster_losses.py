"""Loss counters of the emulated cluster: tbf drops per link and the hosts' TCP counters."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dssync.lab.cluster import Cluster, LossCounters
from dssync.lab.cluster.accounting import _counters

SNMP = """Ip: Forwarding DefaultTTL
Ip: 1 64
Tcp: RtoAlgorithm RtoMin ActiveOpens RetransSegs
Tcp: 1 200 3 17
Udp: InDatagrams
Udp: 5
"""


def test_counters_read_one_table_by_name():
    assert _counters(SNMP, "Tcp:") == {
        "RtoAlgorithm": 1,
        "RtoMin": 200,
        "ActiveOpens": 3,
        "RetransSegs": 17,
    }
    assert _counters(SNMP, "TcpExt:") == {}


def test_losses_count_a_remade_queue_from_zero_and_leave_unshaped_links_blank():
    q0, q1, u = ("h0", "eth"), ("sw", "h0s"), ("sw", "u0")
    ends = {"host:0": [q0, q1], "rack_uplink:0": [u], "rack_uplink:1": [("sw", "u1")]}
    before = LossCounters({q0: ("1:", 5), q1: ("2:", 10), u: ("3:", 10)}, ends, 7, 1)
    after = LossCounters({q0: ("1:", 8), q1: ("9:", 4), u: ("3:", 12)}, ends, 9, 1)
    lost = after - before
    # host:0's switch end was made afresh (new handle): its 4 drops all count
    assert lost.drops == {"host:0": 3 + 4, "rack_uplink:0": 2, "rack_uplink:1": None}
    assert (lost.retransmits, lost.timeouts) == (2, 0)


BLAST = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"x", (sys.argv[1], 9))  # resolve the neighbour first
time.sleep(0.3)
for _ in range(3000):
    try:
        s.sendto(b"x" * 1400, (sys.argv[1], 9))
    except OSError:
        pass
"""


@pytest.mark.root
@pytest.mark.timeout(60)
def test_a_burst_across_the_uplink_is_dropped_there_and_nowhere_else(two_racks):
    with Cluster(two_racks) as cluster:
        before = cluster.losses()
        # 4.2 MB at once: host 0's 1000 Mbit/s link queues it; the 50 Mbit/s uplink cannot
        argv = ["ip", "netns", "exec", cluster.host_ns(0), sys.executable, "-c", BLAST]
        subprocess.run([*argv, cluster.address_of(2)], check=True, timeout=30)
        lost = cluster.losses() - before
    print(f"drops: {lost.drops}")
    assert lost.drops["rack_uplink:0"] > 1000
    # the burst crossed host 2's link and rack 1's uplink at 50 Mbit/s: nothing left to drop
    assert lost.drops["host:0"] == lost.drops["host:2"] == lost.drops["rack_uplink:1"] == 0
    assert set(lost.drops) == set(two_racks.link_names())
