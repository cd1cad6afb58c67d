"""Rate limits with ``tc tbf`` (token bucket filter) on the egress of a network interface.

tbf shapes egress only, so a link is shaped by putting the same tbf on both of its ends.

The queue in front of a shaped link is tbf's own: :data:`LATENCY_MS` worth of the link's rate
(625 KB at 100 Mbit/s), dropping what arrives when it is full (tail drop). That is what a switch
port does; switches do not run fq_codel, which is the default of a Linux host's own NIC queue
(and absent from some kernels, such as the one the tests run on: ``tc`` refuses it there). A
real data-centre port holds less time than 50 ms at its line rate; a queue of 5 ms here dropped
8 to 19 times as many packets under contention, with RTO expiries where 50 ms had none
(``tools/qdisc_contention.py``, docs/cluster.md), so 50 ms stays.
"""

from __future__ import annotations

import json

from dssync.lab.cluster.shell import sh

MIN_BURST_BYTES = 32 * 1024
LATENCY_MS = 50


def burst_bytes(rate_mbit: float) -> int:
    """Bucket size for ``rate_mbit``: 4 ms worth of bytes (one tick at HZ=250), at least 32 KiB.

    A burst smaller than one timer tick's worth of bytes makes tbf under-deliver at high rates.
    """
    return max(int(rate_mbit * 1e6 / 8 / 250), MIN_BURST_BYTES)


def tbf_args(rate_mbit: float) -> list[str]:
    """The ``tbf ...`` part of a tc command for ``rate_mbit`` Mbit/s."""
    kbit = max(int(round(rate_mbit * 1000)), 8)
    return [
        "tbf",
        "rate",
        f"{kbit}kbit",
        "burst",
        str(burst_bytes(rate_mbit)),
        "latency",
        f"{LATENCY_MS}ms",
    ]


def set_tbf(netns: str, dev: str, rate_mbit: float | None) -> None:
    """Shape ``dev`` in ``netns`` to ``rate_mbit`` (add or change); None removes the limit."""
    if rate_mbit is None:
        clear(netns, dev)
        return
    sh(["tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", *tbf_args(rate_mbit)])


def clear(netns: str, dev: str) -> None:
    """Remove any root qdisc from ``dev`` (no error if there is none)."""
    sh(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], check=False)


def current_rate_mbit(netns: str, dev: str) -> float | None:
    """The tbf rate on ``dev`` in Mbit/s as tc reports it, or None when unshaped."""
    out = sh(["tc", "-n", netns, "-j", "qdisc", "show", "dev", dev])
    for qdisc in json.loads(out or "[]"):
        if qdisc.get("kind") == "tbf" and qdisc.get("root", True):
            rate = qdisc.get("options", {}).get("rate")
            if rate is not None:
                return float(rate) * 8 / 1e6
    return None
