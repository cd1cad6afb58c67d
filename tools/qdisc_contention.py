"""Short transfers across a contended emulated uplink, under each queue the uplink can have.

    sudo .venv/bin/python tools/qdisc_contention.py [--seconds 6] [--rate 100] [--size-kb 256]

2 racks x 2 hosts; the rack uplink is shaped to ``--rate`` Mbit/s. Host 0 sends bulk data to host 2
on 2 connections the whole time (the other job); host 1 sends ``--size-kb`` to host 3 over one
kept-open connection and waits for a 1-byte answer, again and again (a gradient exchange). For each
setting it prints the median, 90th percentile and worst duration of those short transfers, the
uplink's drops and the hosts' TCP retransmissions. Settings: tbf's own tail-drop queue of 50 ms
(the emulator's), with ``rto_min 5ms`` on the hosts' routes, and queues of 5 ms and 200 ms;
``--fq-codel`` adds tbf with an fq_codel child (kernels built without sch_fq_codel refuse it).

Root only; the cluster is torn down at the end (or on Ctrl-C). Timing figures need a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from dssync.lab.cluster import Cluster, parse_cluster
from dssync.lab.cluster.shell import sh

SPEC = """
[cluster]
racks = 2
hosts_per_rack = 2
host_rate_mbit = 1000
rack_uplink_mbit = {rate}
"""

SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", int(sys.argv[1]))); s.listen(8)
import threading
def serve(c, size):
    while True:
        got = 0
        while size == 0 or got < size:
            b = c.recv(1 << 20)
            if not b: return
            got += len(b)
        c.sendall(b"k")
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c, int(sys.argv[2])), daemon=True).start()
"""

BULK = """
import socket, sys, time
conns = [socket.create_connection((sys.argv[1], int(sys.argv[2]))) for _ in range(2)]
for c in conns:
    if sys.argv[4]: c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, sys.argv[4].encode())
buf = b"x" * (1 << 16)
end = time.monotonic() + float(sys.argv[3])
import threading
def pump(c):
    while time.monotonic() < end:
        c.sendall(buf)
ts = [threading.Thread(target=pump, args=(c,)) for c in conns]
[t.start() for t in ts]; [t.join() for t in ts]
"""

SHORT = """
import socket, sys, time, json
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if sys.argv[5]: c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, sys.argv[5].encode())
size, end = int(sys.argv[3]), time.monotonic() + float(sys.argv[4])
buf, took = b"y" * size, []
while time.monotonic() < end:
    t = time.monotonic(); c.sendall(buf); c.recv(1); took.append(time.monotonic() - t)
print(json.dumps(took))
"""


def in_host(cluster: Cluster, host: int, code: str, *args: object) -> list[str]:
    return [
        "ip",
        "netns",
        "exec",
        cluster.host_ns(host),
        sys.executable,
        "-c",
        code,
        *map(str, args),
    ]


def set_queue(cluster: Cluster, rate: float, latency_ms: int, child: str | None) -> None:
    """tbf on both ends of every uplink with a queue of ``latency_ms`` at ``rate``; ``child``
    (e.g. ``fq_codel``) replaces tbf's own tail-drop queue where the kernel has it."""
    from dssync.lab.cluster.shaping import tbf_args

    args = tbf_args(rate)
    args[args.index("latency") + 1] = f"{latency_ms}ms"
    for link in cluster.spec.expand_link("rack_uplink"):
        for ns, dev in cluster.link_ends(link):
            sh(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            sh(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", *args])
            if child:
                sh(["tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", child])


def set_rto_min(cluster: Cluster, rto: str | None) -> None:
    for h in range(cluster.spec.num_hosts):
        ns, dev = cluster.host_ns(h), cluster.host_ifname(h)
        extra = ["rto_min", rto] if rto else []
        sh(["ip", "-n", ns, "route", "replace", "10.213.0.0/16", "dev", dev, *extra])


def trial(cluster: Cluster, seconds: float, size: int, cc: str, parallel: int) -> dict:
    sinks = [
        subprocess.Popen(in_host(cluster, 2, SINK, 5001, 0)),
        subprocess.Popen(in_host(cluster, 3, SINK, 5002, size)),
    ]
    try:
        time.sleep(1.0)
        before, drops0 = cluster.losses(), uplink_drops(cluster)
        bulk = subprocess.Popen(
            in_host(cluster, 0, BULK, cluster.address_of(2), 5001, seconds + 1, cc)
        )
        time.sleep(0.5)
        shorts = [  # the exchanges: from hosts 1 and 0 in turn, to host 3
            subprocess.Popen(
                in_host(cluster, 1 - i % 2, SHORT, cluster.address_of(3), 5002, size, seconds, cc),
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(parallel)
        ]
        outs = [p.communicate(timeout=seconds + 120)[0] for p in shorts]
        bulk.wait(timeout=30)
        lost = cluster.losses() - before
    finally:
        for p in sinks:
            p.kill()
            p.wait()
    took = sorted(t for out in outs for t in json.loads(out))
    return {
        "n": len(took),
        "median_ms": 1000 * statistics.median(took),
        "p90_ms": 1000 * took[int(0.9 * (len(took) - 1))],
        "worst_ms": 1000 * took[-1],
        "losses": f"retransmits {lost.retransmits}, RTOs {lost.timeouts}, "
        f"uplink drops {uplink_drops(cluster) - drops0}",
    }


def uplink_drops(cluster: Cluster) -> int:
    """Packets dropped by every qdisc (tbf and its child) on the rack uplinks."""
    total = 0
    for link in cluster.spec.expand_link("rack_uplink"):
        for ns, dev in cluster.link_ends(link):
            for q in json.loads(sh(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev])):
                total += int(q.get("drops", 0)) if q.get("kind") != "tbf" or q.get("root") else 0
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--size-kb", type=int, default=256)
    ap.add_argument("--parallel", type=int, default=1, help="exchanges at once (hosts 0, 1)")
    ap.add_argument(
        "--cc", default=None, help="the senders' TCP congestion control (default: the host's)"
    )
    ap.add_argument(
        "--fq-codel", action="store_true", help="also tbf + fq_codel (needs sch_fq_codel)"
    )
    args = ap.parse_args()
    settings = [  # (name, tbf latency ms, child qdisc, rto_min)
        ("tail drop 50 ms (default)", 50, None, None),
        ("tail drop 50 ms, rto_min 5ms", 50, None, "5ms"),
        ("tail drop 5 ms", 5, None, None),
        ("tail drop 200 ms", 200, None, None),
    ]
    if args.fq_codel:
        settings += [
            ("tbf + fq_codel", 50, "fq_codel", None),
            ("tbf + fq_codel, rto_min 5ms", 50, "fq_codel", "5ms"),
        ]
    with Cluster(parse_cluster(SPEC.format(rate=args.rate), "qdisc contention")) as cluster:
        for name, latency_ms, child, rto in settings:
            set_queue(cluster, args.rate, latency_ms, child)
            set_rto_min(cluster, rto)
            r = trial(cluster, args.seconds, args.size_kb * 1024, args.cc or "", args.parallel)
            print(
                f"{name:30s} n={r['n']:4d} median {r['median_ms']:7.1f} ms  "
                f"p90 {r['p90_ms']:7.1f} ms  worst {r['worst_ms']:7.1f} ms  {r['losses']}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
