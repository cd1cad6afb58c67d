"""Per-link byte counters, read from the switch namespace, which holds one end of every link;
and the loss counters of a run: tbf drops per link and TCP's retransmissions in the host
namespaces (each namespace keeps its own ``/proc/net/snmp``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from dssync.lab.cluster.names import ClusterNames
from dssync.lab.cluster.shell import ClusterError, sh


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


Queue = tuple[str, str]  # (namespace, interface) of one tbf


@dataclass(frozen=True)
class Losses:
    """Losses between two snapshots: packets the tbf queues dropped per link (both ends summed;
    None for a link with no tbf, such as a missing uplink), and the TCP segments the hosts
    retransmitted and their retransmission timeouts (RTO expiries).

    Example::

        before = cluster.losses()
        ...  # run a benchmark
        lost = cluster.losses() - before
        lost.drops["rack_uplink:0"], lost.retransmits, lost.timeouts
    """

    drops: dict[str, int | None]
    retransmits: int
    timeouts: int


@dataclass(frozen=True)
class LossCounters:
    """One snapshot of the loss counters; subtract an earlier one to get :class:`Losses`.

    ``queues`` holds (tc handle, drops) of every tbf; a queue whose handle changed was made
    afresh (its counters start at zero), so it counts from zero.
    """

    queues: dict[Queue, tuple[str, int]]
    ends: dict[str, list[Queue]]
    retransmits: int
    timeouts: int

    def __sub__(self, before: LossCounters) -> Losses:
        def since(end: Queue) -> int:
            handle, now = self.queues[end]
            then_handle, then = before.queues.get(end, (None, 0))
            return now - then if handle == then_handle and now >= then else now

        drops: dict[str, int | None] = {}
        for link, ends in self.ends.items():
            shaped = [e for e in ends if e in self.queues]
            drops[link] = sum(since(e) for e in shaped) if shaped else None
        return Losses(
            drops,
            self.retransmits - before.retransmits,
            self.timeouts - before.timeouts,
        )


def losses(cluster: ClusterNames) -> LossCounters:
    """The loss counters now (tbf drops since each queue was made, TCP's since the cluster was
    built); raises ClusterError naming the namespace whose counters could not be read."""
    spec = cluster.spec
    queues: dict[Queue, tuple[str, int]] = {}
    namespaces = [cluster.switch_ns] + [cluster.host_ns(h) for h in range(spec.num_hosts)]
    for ns in namespaces:
        try:
            for q in json.loads(sh(["tc", "-n", ns, "-s", "-j", "qdisc", "show"]) or "[]"):
                if q.get("kind") == "tbf":
                    queues[(ns, q["dev"])] = (str(q.get("handle")), int(q.get("drops", 0)))
        except (ValueError, KeyError) as e:
            raise ClusterError(f"could not read the tbf counters of {ns} (`tc -s -j`): {e}") from e
    ends = {link: cluster.link_ends(link) for link in spec.link_names()}
    retransmits = timeouts = 0
    for h in range(spec.num_hosts):
        ns = cluster.host_ns(h)
        tcp = _counters(sh(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]), "Tcp:")
        ext = _counters(sh(["ip", "netns", "exec", ns, "cat", "/proc/net/netstat"]), "TcpExt:")
        retransmits += tcp.get("RetransSegs", 0)
        timeouts += ext.get("TCPTimeouts", 0)
    return LossCounters(queues, ends, retransmits, timeouts)


def _counters(text: str, table: str) -> dict[str, int]:
    """One table of a /proc/net/snmp-style file: a header line of names, then one of values."""
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith(table)]
    if len(rows) < 2:
        return {}
    pairs = zip(rows[0], rows[1], strict=False)  # a short line reads as missing counters
    return {name: int(value) for name, value in pairs if value.lstrip("-").isdigit()}
