"""Names and addresses of an emulated cluster's pieces, from its spec and a prefix.

Layout for prefix ``p`` (every name starts with it; interface names stay under 15 chars):

* one namespace per host, ``p-h<i>``, holding interface ``p h<i>`` with address 10.213.x.y/16;
  ``p-h<i>`` is also the host's name (its UTS host name under torchrun, in every host's
  ``/etc/netns/p-h<i>/hosts``);
* one switch namespace ``p-sw`` holding rack bridges ``p r<r>``, the core bridge ``p core``,
  the switch end ``p h<i>s`` of each host link and both ends ``p u<r>`` / ``p u<r>c`` of each
  rack uplink. Nothing is attached to the root namespace, so no traffic can leave.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from pathlib import Path

from dssync.lab.cluster.shell import ClusterError
from dssync.lab.cluster.spec import ClusterSpec

SUBNET = ipaddress.ip_network("10.213.0.0/16")
PREFIX_RE = re.compile(r"^dss[a-z0-9]{1,6}$")
ANY_PREFIX_RE = re.compile(r"^(dss[a-z0-9]{1,6})-(h\d+|sw)$")
# Per-namespace files that ``ip netns exec`` mounts over /etc (a host's /etc/hosts).
ETC_NETNS = Path("/etc/netns")


def new_prefix() -> str:
    """A fresh random prefix such as ``dss3fa9``."""
    return f"dss{secrets.token_hex(2)}"


def check_prefix(prefix: str) -> str:
    if not PREFIX_RE.match(prefix):
        raise ClusterError(
            f"prefix {prefix!r} is not valid; use 'dss' followed by 1-6 lowercase letters or "
            "digits, e.g. dss01"
        )
    return prefix


class ClusterNames:
    """Where each piece of a cluster lives (namespaces, interfaces, addresses); builds nothing.

    Example::

        names = ClusterNames(load_cluster("tiny"), prefix="dss01")
        names.host_ns(1), names.address_of(1)     # ("dss01-h1", "10.213.0.2")
    """

    def __init__(self, spec: ClusterSpec, prefix: str | None = None) -> None:
        self.spec = spec
        self.prefix = check_prefix(prefix) if prefix else new_prefix()

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    def host_ns(self, host: int) -> str:
        self.spec.rack_of_host(host)
        return f"{self.prefix}-h{host}"

    def host_ifname(self, host: int) -> str:
        """The host's interface inside its namespace (use as GLOO_SOCKET_IFNAME)."""
        self.spec.rack_of_host(host)
        return f"{self.prefix}h{host}"

    def address_of(self, host: int) -> str:
        """The IPv4 address of host ``host`` (e.g. ``10.213.0.1`` for host 0)."""
        self.spec.rack_of_host(host)
        return str(SUBNET.network_address + host + 1)

    def link_ends(self, link: str) -> list[tuple[str, str]]:
        """The (namespace, interface) pairs at both ends of a concrete link like ``host:3``."""
        kind, index = link.split(":")
        i = int(index)
        if kind == "host":
            return [(self.host_ns(i), self.host_ifname(i)), (self.switch_ns, f"{self.prefix}h{i}s")]
        return [(self.switch_ns, f"{self.prefix}u{i}"), (self.switch_ns, f"{self.prefix}u{i}c")]
