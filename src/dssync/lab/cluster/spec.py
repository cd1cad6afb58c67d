"""Cluster spec files: parse a TOML description of an emulated cluster into frozen dataclasses.

A cluster is ``racks`` racks of ``hosts_per_rack`` hosts, each running ``workers_per_host``
workers. Each host has a link to its rack switch; with more than one rack, each rack has an
uplink to a core switch (the inter-rack bottleneck). Global rank
``r = host * workers_per_host + local``; host ``h`` sits in rack ``h // hosts_per_rack``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dssync.errors import UsageError
from dssync.topology.model import Topology


class ClusterSpecError(UsageError):
    """A cluster spec file (or link name) is malformed; the message names the file and the fix."""


@dataclass(frozen=True)
class Event:
    """A timed rate change: at ``at_s`` seconds or ``at_fraction`` of the run, set ``link``."""

    link: str
    rate_mbit: float
    at_s: float | None = None
    at_fraction: float | None = None

    def time_in(self, duration_s: float | None) -> float:
        """Seconds after the start at which this event fires, for a run of ``duration_s``."""
        if self.at_s is not None:
            return self.at_s
        if duration_s is None:
            raise ClusterSpecError(
                f"event on {self.link!r} uses at_fraction={self.at_fraction} but no run duration "
                "was given; pass duration_s (CLI: --duration SECONDS) or use at_s in the file"
            )
        return float(self.at_fraction) * duration_s


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed cluster spec: racks, hosts, workers per host, link rates and timed events.

    Example::

        spec = load_cluster("s2-inter-rack")
        spec.world_size          # 8
        spec.rack_of_rank(5)     # 1
        spec.link_rates()        # {"host:0": 1000.0, ..., "rack_uplink:0": 200.0, ...}
        spec.topology()          # the dssync.topology.Topology of its ranks, rates as configured
    """

    name: str
    racks: int
    hosts_per_rack: int
    workers_per_host: int
    host_rate_mbit: float
    rack_uplink_mbit: float | None = None
    host_overrides: dict[int, float] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    source: str = "<memory>"

    @property
    def num_hosts(self) -> int:
        return self.racks * self.hosts_per_rack

    @property
    def world_size(self) -> int:
        return self.num_hosts * self.workers_per_host

    def host_of_rank(self, rank: int) -> int:
        self._check_rank(rank)
        return rank // self.workers_per_host

    def local_rank(self, rank: int) -> int:
        self._check_rank(rank)
        return rank % self.workers_per_host

    def rack_of_host(self, host: int) -> int:
        self._check_host(host)
        return host // self.hosts_per_rack

    def rack_of_rank(self, rank: int) -> int:
        return self.rack_of_host(self.host_of_rank(rank))

    def ranks_on_host(self, host: int) -> list[int]:
        self._check_host(host)
        first = host * self.workers_per_host
        return list(range(first, first + self.workers_per_host))

    def hosts_in_rack(self, rack: int) -> list[int]:
        if not 0 <= rack < self.racks:
            raise ClusterSpecError(f"rack {rack} does not exist; racks are 0..{self.racks - 1}")
        first = rack * self.hosts_per_rack
        return list(range(first, first + self.hosts_per_rack))

    def ranks_in_rack(self, rack: int) -> list[int]:
        return [r for h in self.hosts_in_rack(rack) for r in self.ranks_on_host(h)]

    def host_rate(self, host: int) -> float:
        """Rate in Mbit/s of host ``host``'s link to its rack switch."""
        self._check_host(host)
        return self.host_overrides.get(host, self.host_rate_mbit)

    def uplink_rate(self, rack: int) -> float | None:
        """Rate in Mbit/s of rack ``rack``'s uplink to the core; None means unshaped."""
        self.hosts_in_rack(rack)
        return self.rack_uplink_mbit

    @property
    def has_core(self) -> bool:
        """True when racks are joined by uplinks to a core switch (more than one rack)."""
        return self.racks > 1

    def link_names(self) -> list[str]:
        """Every concrete link: ``host:<h>`` for each host, ``rack_uplink:<r>`` for each rack."""
        names = [f"host:{h}" for h in range(self.num_hosts)]
        if self.has_core:
            names += [f"rack_uplink:{r}" for r in range(self.racks)]
        return names

    def link_rates(self) -> dict[str, float | None]:
        """Initial rate in Mbit/s of each concrete link (None: unshaped)."""
        rates: dict[str, float | None] = {}
        for name in self.link_names():
            kind, index = name.split(":")
            rates[name] = self.host_rate(int(index)) if kind == "host" else self.rack_uplink_mbit
        return rates

    def expand_link(self, link: str) -> list[str]:
        """Resolve ``rack_uplink``, ``rack_uplink:1``, ``host:3`` (or ``host``) to concrete links."""
        kind, _, index = link.partition(":")
        fix = f"use one of: host, host:<0..{self.num_hosts - 1}>"
        if self.has_core:
            fix += f", rack_uplink, rack_uplink:<0..{self.racks - 1}>"
        if kind == "host":
            count = self.num_hosts
        elif kind == "rack_uplink" and self.has_core:
            count = self.racks
        else:
            raise ClusterSpecError(f"unknown link {link!r}; {fix}")
        if not index:
            return [f"{kind}:{i}" for i in range(count)]
        if not index.isdigit() or int(index) >= count:
            raise ClusterSpecError(f"link {link!r} does not exist; {fix}")
        return [f"{kind}:{int(index)}"]

    def topology(self) -> Topology:
        """The exact :class:`~dssync.topology.Topology` of this cluster (rates as configured)."""
        ranks = range(self.world_size)
        plain = Topology(
            hosts=tuple(self.host_of_rank(r) for r in ranks),
            racks=tuple(self.rack_of_rank(r) for r in ranks),
        )
        host_mbit = {h: self.host_rate(h) for h in range(self.num_hosts)}
        return plain.with_rates(host_mbit, self.rack_uplink_mbit if self.has_core else None)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ClusterSpecError(
                f"rank {rank} does not exist; ranks are 0..{self.world_size - 1}"
            )

    def _check_host(self, host: int) -> None:
        if not 0 <= host < self.num_hosts:
            raise ClusterSpecError(f"host {host} does not exist; hosts are 0..{self.num_hosts - 1}")


def shipped_clusters() -> list[str]:
    """Names of the cluster spec files shipped in ``dssync/lab/cluster/specs``."""
    folder = resources.files("dssync.lab.cluster") / "specs"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """Load a shipped cluster spec by name (``"s2-inter-rack"``) or a TOML file by path."""
    text_name = str(name_or_path)
    path = Path(text_name)
    if path.is_file():
        return parse_cluster(path.read_text(), source=str(path))
    shipped = (
        resources.files("dssync.lab.cluster") / "specs" / f"{text_name.removesuffix('.toml')}.toml"
    )
    if not shipped.is_file():
        raise ClusterSpecError(
            f"cluster spec {text_name!r} is neither a file nor a shipped name; "
            f"use a path or one of: {', '.join(shipped_clusters())}"
        )
    return parse_cluster(shipped.read_text(), source=f"{shipped.name} (shipped)")


def parse_cluster(text: str, source: str = "<string>") -> ClusterSpec:
    """Parse cluster spec TOML text; ``source`` names the file in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClusterSpecError(f"{source}: not valid TOML ({exc}); fix the syntax") from None
    _Checker(source).check_keys(data, {"name", "cluster", "host_override", "event"}, "top level")
    check = _Checker(source)
    cluster = check.table(data, "cluster")
    check.check_keys(
        cluster,
        {"racks", "hosts_per_rack", "workers_per_host", "host_rate_mbit", "rack_uplink_mbit"},
        "[cluster]",
    )
    racks = check.positive_int(cluster, "racks", "[cluster]", default=1)
    spec = ClusterSpec(
        name=check.string(data, "name", Path(source.split(" ")[0]).stem),
        racks=racks,
        hosts_per_rack=check.positive_int(cluster, "hosts_per_rack", "[cluster]"),
        workers_per_host=check.positive_int(cluster, "workers_per_host", "[cluster]", default=1),
        host_rate_mbit=check.rate(cluster, "host_rate_mbit", "[cluster]"),
        rack_uplink_mbit=check.rate(cluster, "rack_uplink_mbit", "[cluster]", optional=True),
        source=source,
    )
    if spec.rack_uplink_mbit is not None and racks == 1:
        raise ClusterSpecError(
            f"{source}: rack_uplink_mbit is set but racks = 1, so there is no uplink; "
            "remove rack_uplink_mbit or set racks >= 2"
        )
    overrides: dict[int, float] = {}
    for i, item in enumerate(check.array(data, "host_override")):
        where = f"[[host_override]] #{i + 1}"
        check.check_keys(item, {"host", "rate_mbit"}, where)
        host = check.int_in(item, "host", where, spec.num_hosts)
        if host in overrides:
            raise ClusterSpecError(f"{source}: host {host} is overridden twice; keep one {where}")
        overrides[host] = check.rate(item, "rate_mbit", where)
    events = []
    for i, item in enumerate(check.array(data, "event")):
        events.append(check.event(item, f"[[event]] #{i + 1}", spec))
    return replace(spec, host_overrides=overrides, events=tuple(events))


class _Checker:
    """Small helpers that read typed values and raise ClusterSpecError naming file and fix."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, message: str) -> ClusterSpecError:
        return ClusterSpecError(f"{self.source}: {message}")

    def check_keys(self, table: dict[str, Any], allowed: set[str], where: str) -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(
                f"unknown key {unknown[0]!r} in {where}; allowed keys: {', '.join(sorted(allowed))}"
            )

    def table(self, data: dict[str, Any], key: str) -> dict[str, Any]:
        if key not in data:
            raise self.fail(f"missing [{key}] table; add [{key}] with racks, hosts_per_rack, ...")
        if not isinstance(data[key], dict):
            raise self.fail(f"{key!r} must be a table; write it as [{key}]")
        return data[key]

    def array(self, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
        items = data.get(key, [])
        if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
            raise self.fail(f"{key!r} must be an array of tables; write each entry as [[{key}]]")
        return items

    def string(self, data: dict[str, Any], key: str, default: str) -> str:
        value = data.get(key, default)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{key!r} must be a non-empty string, got {value!r}; quote it")
        return value

    def positive_int(
        self, data: dict[str, Any], key: str, where: str, default: int | None = None
    ) -> int:
        if key not in data and default is not None:
            return default
        value = self._present(data, key, where, "a positive integer")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(f"{key} in {where} must be a positive integer, got {value!r}; e.g. 2")
        return value

    def int_in(self, data: dict[str, Any], key: str, where: str, count: int) -> int:
        value = self._present(data, key, where, "an integer")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise self.fail(f"{key} in {where} is {value!r}; use an index in 0..{count - 1}")
        return value

    def rate(self, data: dict[str, Any], key: str, where: str, optional: bool = False) -> Any:
        if optional and key not in data:
            return None
        value = self._present(data, key, where, "a rate in Mbit/s")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise self.fail(f"{key} in {where} must be a positive number of Mbit/s, got {value!r}")
        return float(value)

    def event(self, item: dict[str, Any], where: str, spec: ClusterSpec) -> Event:
        self.check_keys(item, {"at_s", "at_fraction", "link", "rate_mbit"}, where)
        if ("at_s" in item) == ("at_fraction" in item):
            raise self.fail(f"{where} needs exactly one of at_s or at_fraction; keep one")
        link = item.get("link")
        if not isinstance(link, str):
            raise self.fail(f'{where} needs link = "rack_uplink", "rack_uplink:<r>" or "host:<h>"')
        try:
            spec.expand_link(link)
        except ClusterSpecError as exc:
            raise self.fail(f"{where}: {exc}") from None
        rate = self.rate(item, "rate_mbit", where)
        if "at_s" in item:
            at = item["at_s"]
            if isinstance(at, bool) or not isinstance(at, int | float) or at < 0:
                raise self.fail(f"at_s in {where} must be seconds >= 0, got {at!r}")
            return Event(link=link, rate_mbit=rate, at_s=float(at))
        at = item["at_fraction"]
        if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at <= 1:
            raise self.fail(f"at_fraction in {where} must be between 0 and 1, got {at!r}")
        return Event(link=link, rate_mbit=rate, at_fraction=float(at))

    def _present(self, data: dict[str, Any], key: str, where: str, what: str) -> Any:
        if key not in data:
            raise self.fail(f"missing {key} in {where}; add {key} = <{what}>")
        return data[key]
