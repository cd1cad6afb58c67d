"""2 MB both ways at once across S3's slow host link: plain TCP against gloo, on the emulated cluster.

Builds ``s3-slow-host`` (root, iproute2), then between host 0 and the 100 Mbit/s host 3 times
``--tries`` exchanges of 2 MB in each direction at once, 0.2 s apart:

* ``tcp``: one TCP connection, each side sending while it receives (plain sockets); the client
  starts a try with one byte and the server starts on it, so neither side's bytes sit waiting in
  the other's socket before the clock starts;
* ``tcp, no slow start after idle``: the same with ``net.ipv4.tcp_slow_start_after_idle=0``
  written in both host namespaces;
* ``gloo``: ``batch_isend_irecv`` of a 2 MB tensor each way, the send posted first (what a
  DS-Sync pair exchange posted before it put receives first);
* ``gloo, receive posted first``: the same batch with the receive first (what it posts now);
* ``gloo one way``: ``send`` / ``recv`` of the same tensor.

Prints one line per kind with each try's milliseconds and Mbit/s each way; tears the cluster down.
Usage: ``sudo .venv/bin/python tools/both_ways.py [--tries 6]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

NBYTES = 2_000_000
PORT_TCP, PORT_GLOO = 5999, 29123


def tcp_side(role: str, address: str, tries: int) -> None:
    import socket

    if role == "server":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((address, PORT_TCP))
        ls.listen(1)
        s, _ = ls.accept()
    else:
        s = socket.create_connection((address, PORT_TCP), timeout=30)
    payload = b"x" * NBYTES
    for _ in range(tries):
        # both sides start together: the client waits, then sends one byte; the server starts on it
        if role == "client":
            time.sleep(0.2)
            s.sendall(b"g")
        elif s.recv(1) != b"g":
            return
        got = 0

        def receive() -> None:
            nonlocal got
            while got < NBYTES:
                chunk = s.recv(1 << 20)
                if not chunk:
                    return
                got += len(chunk)

        t0 = time.perf_counter()
        rx = threading.Thread(target=receive)
        rx.start()
        s.sendall(payload)
        rx.join(timeout=30)
        if role == "client":
            print(time.perf_counter() - t0, flush=True)


def gloo_side(rank: int, master: str, ifname: str, tries: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(PORT_GLOO), GLOO_SOCKET_IFNAME=ifname)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    peer = 1 - rank
    mine, theirs = torch.ones(NBYTES // 4), torch.empty(NBYTES // 4)
    for kind in ("gloo", "gloo, receive posted first", "gloo one way"):
        for _ in range(tries):
            dist.barrier()
            time.sleep(0.2)
            dist.barrier()
            t0 = time.perf_counter()
            if kind == "gloo":
                ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
            elif kind == "gloo, receive posted first":
                ops = [dist.P2POp(dist.irecv, theirs, peer), dist.P2POp(dist.isend, mine, peer)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
            elif rank == 0:
                dist.send(mine, peer)
            else:
                dist.recv(theirs, peer)
            dist.barrier() if kind == "gloo one way" else None
            if rank == 0:
                print(kind, time.perf_counter() - t0, flush=True)
    dist.destroy_process_group()


def line(kind: str, seconds: list[float]) -> str:
    tries = ", ".join(f"{s * 1000:.0f} ms ({NBYTES * 8 / s / 1e6:.0f})" for s in seconds)
    return f"{kind:32s} {tries}"


def main() -> None:
    from dssync.lab.cluster import Cluster
    from dssync.lab.cluster.spec import load_cluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=6)
    args = parser.parse_args()
    me = [sys.executable, __file__]
    with Cluster(load_cluster("s3-slow-host")) as c:
        fast, slow = 0, 3
        ns = {h: c.host_ns(h) for h in (fast, slow)}

        def run(host: int, *extra: str) -> subprocess.Popen:
            cmd = ["ip", "netns", "exec", ns[host], *me, *extra]
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

        def tcp(kind: str) -> None:
            server = run(slow, "--side", "server", c.address_of(slow), str(args.tries))
            time.sleep(1)
            client = run(fast, "--side", "client", c.address_of(slow), str(args.tries))
            out, _ = client.communicate(timeout=120)
            server.wait(timeout=30)
            print(line(kind, [float(v) for v in out.split()]), flush=True)

        print("kind                             each try: ms (Mbit/s each way)")
        tcp("tcp")
        for h in (fast, slow):
            subprocess.run(
                ["ip", "netns", "exec", ns[h], "sysctl", "-q", "-w",
                 "net.ipv4.tcp_slow_start_after_idle=0"],
                check=True,
            )  # fmt: skip
        tcp("tcp, no slow start after idle")
        master = c.address_of(fast)
        procs = [
            run(h, "--side", f"gloo{r}", master, c.host_ifname(h), str(args.tries))
            for r, h in enumerate((fast, slow))
        ]
        out, _ = procs[0].communicate(timeout=300)
        procs[1].wait(timeout=60)
        for kind in ("gloo", "gloo, receive posted first", "gloo one way"):
            times = [float(v.split()[-1]) for v in out.splitlines() if v.rsplit(" ", 1)[0] == kind]
            print(line(kind, times), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--side":
        side, rest = sys.argv[2], sys.argv[3:]
        if side in ("server", "client"):
            tcp_side(side, rest[0], int(rest[1]))
        else:
            gloo_side(int(side[-1]), rest[0], rest[1], int(rest[2]))
    else:
        main()
