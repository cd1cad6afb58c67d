"""Per-link byte counters, read from the switch namespace, which holds one end of every link."""

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
