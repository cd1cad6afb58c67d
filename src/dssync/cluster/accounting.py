"""Per-link byte counters, read from the switch namespace, which holds one end of every link;
and the loss counters of a run: tbf drops per link and TCP's retransmissions in the host
namespaces (each namespace keeps its own ``/proc/net/snmp``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from dssync.cluster.names import ClusterNames
from dssync.cluster.shell import sh


@dataclass(frozen=True)
class LinkBytes:
    """Bytes a link carried: ``up`` from the host (or rack) side, ``down`` towards it.

    Example::

        before = cluster.link_bytes()
        ...  # run a benchmark
        moved = diff(cluster.link_bytes(), before)
        moved["rack_uplink:0"].up    # bytes rack 0 sent to the core
    """

    up: int
    down: int

    @property
    def total(self) -> int:
        return self.up + self.down


def link_bytes(cluster: ClusterNames) -> dict[str, LinkBytes]:
    """Counters for every link (``host:<h>``, ``rack_uplink:<r>``) since the cluster was built."""
    out = sh(["ip", "-n", cluster.switch_ns, "-s", "-j", "link", "show"])
    stats = {}
    for link in json.loads(out or "[]"):
        s = link.get("stats64") or link.get("stats", {})
        stats[link["ifname"]] = (s["rx"]["bytes"], s["tx"]["bytes"])
    counters = {}
    p = cluster.prefix
    for name in cluster.spec.link_names():
        kind, index = name.split(":")
        # The host link's switch end receives what the host sends; the uplink's rack end
        # transmits what the rack sends to the core.
        if kind == "host":
            rx, tx = stats[f"{p}h{index}s"]
            counters[name] = LinkBytes(up=rx, down=tx)
        else:
            rx, tx = stats[f"{p}u{index}"]
            counters[name] = LinkBytes(up=tx, down=rx)
    return counters


def diff(after: dict[str, LinkBytes], before: dict[str, LinkBytes]) -> dict[str, LinkBytes]:
    """Bytes moved on each link between two ``link_bytes`` snapshots."""
    return {k: LinkBytes(after[k].up - before[k].up, after[k].down - before[k].down) for k in after}


@dataclass(frozen=True)
class Losses:
    """Loss counters: packets the tbf queues dropped per link (both ends summed), and the TCP
    segments the hosts retransmitted and their retransmission timeouts (RTO expiries).

    Example::

        before = losses(cluster)
        ...  # run a benchmark
        lost = losses(cluster) - before
        lost.drops["rack_uplink:0"], lost.retransmits, lost.timeouts
    """

    drops: dict[str, int]
    retransmits: int
    timeouts: int

    def __sub__(self, before: Losses) -> Losses:
        # A qdisc replaced by another kind starts again from zero: count from there.
        def since(now: int, then: int) -> int:
            return now - then if now >= then else now

        return Losses(
            {k: since(v, before.drops.get(k, 0)) for k, v in self.drops.items()},
            since(self.retransmits, before.retransmits),
            since(self.timeouts, before.timeouts),
        )


def losses(cluster: ClusterNames) -> Losses:
    """The loss counters now, since the cluster was built."""
    spec = cluster.spec
    qdisc_drops: dict[tuple[str, str], int] = {}
    namespaces = [cluster.switch_ns] + [cluster.host_ns(h) for h in range(spec.num_hosts)]
    for ns in namespaces:
        for q in json.loads(sh(["tc", "-n", ns, "-s", "-j", "qdisc", "show"]) or "[]"):
            if q.get("kind") == "tbf":
                qdisc_drops[(ns, q["dev"])] = int(q.get("drops", 0))
    drops = {
        link: sum(qdisc_drops.get(end, 0) for end in cluster.link_ends(link))
        for link in spec.link_names()
    }
    retransmits = timeouts = 0
    for h in range(spec.num_hosts):
        ns = cluster.host_ns(h)
        tcp = _counters(sh(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]), "Tcp:")
        ext = _counters(sh(["ip", "netns", "exec", ns, "cat", "/proc/net/netstat"]), "TcpExt:")
        retransmits += tcp.get("RetransSegs", 0)
        timeouts += ext.get("TCPTimeouts", 0)
    return Losses(drops, retransmits, timeouts)


def _counters(text: str, table: str) -> dict[str, int]:
    """One table of a /proc/net/snmp-style file: a header line of names, then one of values."""
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith(table)]
    if len(rows) < 2:
        return {}
    pairs = zip(rows[0], rows[1], strict=True)
    return {name: int(value) for name, value in pairs if value.lstrip("-").isdigit()}
