"""Measure TCP throughput between two hosts of a live cluster (a tiny sender and receiver)."""

from __future__ import annotations

import subprocess
import sys

from dssync.lab.cluster.names import ClusterNames
from dssync.lab.cluster.shell import ClusterError

# Receiver: accept one connection, count bytes, print Mbit/s from the first to the last byte.
RECEIVER = """
import socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(1); srv.settimeout(float(sys.argv[2]))
print("ready", flush=True)
conn, _ = srv.accept(); conn.settimeout(float(sys.argv[2]))
data = conn.recv(1 << 16); start = time.monotonic(); total = 0
while data:
    total += len(data); data = conn.recv(1 << 16)
print(total, (total - 0) * 8 / (time.monotonic() - start) / 1e6, flush=True)
"""

SENDER = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
chunk = b"x" * (1 << 16); left = int(sys.argv[3])
while left > 0:
    s.sendall(chunk[:left]); left -= len(chunk)
s.close()
"""


def measure_mbit(
    cluster: ClusterNames,
    src: int,
    dst: int,
    nbytes: int = 4_000_000,
    timeout_s: float = 15.0,
    port: int = 5201,
) -> float:
    """Send ``nbytes`` over TCP from host ``src`` to host ``dst``; return Mbit/s received."""
    recv = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            cluster.host_ns(dst),
            sys.executable,
            "-c",
            RECEIVER,
            str(port),
            str(timeout_s),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if recv.stdout is None or recv.stdout.readline().strip() != "ready":
            raise ClusterError("throughput receiver did not start")
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                cluster.host_ns(src),
                sys.executable,
                "-c",
                SENDER,
                cluster.address_of(dst),
                str(port),
                str(nbytes),
                str(timeout_s),
            ],
            check=True,
            timeout=timeout_s,
        )
        out, _ = recv.communicate(timeout=timeout_s)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait(timeout=5)
    total, mbit = out.split()
    if int(total) != nbytes:
        raise ClusterError(f"receiver got {total} of {nbytes} bytes")
    return float(mbit)
