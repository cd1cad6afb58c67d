"""Clusters to plan for: shipped topology files scaled to more racks, and generated fabrics.

Every cluster here is a :class:`dssync.lab.cluster.ClusterSpec` (racks of hosts, host link rates, one
uplink rate per rack), the same description the topology files give, so a generated cluster can
be written out with :func:`to_toml` and run on the emulated cluster as is.

Example::

    >>> spec = cluster_for("s2-inter-rack", workers=64)
    >>> spec.racks, spec.hosts_per_rack, spec.rack_uplink_mbit
    (16, 4, 200.0)
    >>> fat_tree(1024).racks
    128
"""

from __future__ import annotations

from dataclasses import replace

from dssync.errors import UsageError
from dssync.lab.cluster.spec import ClusterSpec, ClusterSpecError, load_cluster, shipped_clusters

GENERATORS = ("fat-tree", "rack-spine")


def scaled(spec: ClusterSpec, workers: int) -> ClusterSpec:
    """``spec`` with as many racks as ``workers`` needs: same rack size, link rates and pattern.

    The file's racks are repeated as a block: a host override (a slow host) recurs in every copy,
    so the fraction of slow hosts stays the file's. Timed events are kept (they name links by
    kind, ``rack_uplink`` or a host of the first block). One rack without an uplink becomes racks
    behind an unshaped core (the file sets no rate between racks).
    """
    per_rack = spec.hosts_per_rack * spec.workers_per_host
    if workers < 1 or workers % per_rack:
        lower = max(per_rack, workers // per_rack * per_rack)
        raise UsageError(
            f"--workers {workers} is not a multiple of {per_rack}, the workers in one rack of "
            f"{spec.name}; use {lower} or {lower + per_rack}"
        )
    racks = workers // per_rack
    block = spec.num_hosts
    overrides = {
        h + k * block: rate
        for h, rate in spec.host_overrides.items()
        for k in range(-(-racks * spec.hosts_per_rack // block))
    }
    hosts = racks * spec.hosts_per_rack
    return replace(
        spec,
        racks=racks,
        host_overrides={h: r for h, r in overrides.items() if h < hosts},
        events=spec.events if racks >= spec.racks else (),
    )


def fat_tree(
    workers: int, ports: int = 16, host_mbit: float = 25_000.0, workers_per_host: int = 1
) -> ClusterSpec:
    """A non-blocking fat-tree of ``ports``-port switches: ports/2 hosts per edge switch.

    Each edge switch (a "rack") has ports/2 uplinks at the host rate, so its uplink carries
    ports/2 * host_mbit: full bisection bandwidth, spread evenly by ECMP (an ideal assumption).
    A fat-tree of k-port switches holds at most k**3/4 hosts.
    """
    _check_positive(ports=ports, workers_per_host=workers_per_host)
    if ports % 2:
        raise UsageError(
            f"ports={ports} must be even (half face the hosts, half the core); use {ports + 1}"
        )
    per_rack = ports // 2 * workers_per_host
    if workers % per_rack or workers < 1:
        raise UsageError(
            f"workers={workers} must be a multiple of {per_rack} for a fat-tree of "
            f"{ports}-port switches; use {max(per_rack, workers // per_rack * per_rack)}"
        )
    if workers // workers_per_host > ports**3 // 4:
        raise UsageError(
            f"a fat-tree of {ports}-port switches holds {ports**3 // 4} hosts, not "
            f"{workers // workers_per_host}; use ports >= {_ports_for(workers // workers_per_host)}"
        )
    return ClusterSpec(
        name=f"fat-tree-k{ports}",
        racks=workers // per_rack,
        hosts_per_rack=ports // 2,
        workers_per_host=workers_per_host,
        host_rate_mbit=float(host_mbit),
        rack_uplink_mbit=float(host_mbit * ports // 2) if workers > per_rack else None,
    )


def rack_spine(
    workers: int,
    hosts_per_rack: int = 16,
    host_mbit: float = 25_000.0,
    oversubscription: float = 4.0,
    workers_per_host: int = 1,
) -> ClusterSpec:
    """Racks of ``hosts_per_rack`` hosts whose uplink to the spine is oversubscribed.

    The rack uplink carries hosts_per_rack * host_mbit / oversubscription (4:1 by default, as
    many leaf-spine fabrics are built).
    """
    _check_positive(hosts_per_rack=hosts_per_rack, workers_per_host=workers_per_host)
    if not oversubscription >= 1:
        raise UsageError(
            f"oversubscription={oversubscription} must be >= 1; use 1 for non-blocking"
        )
    per_rack = hosts_per_rack * workers_per_host
    if workers % per_rack or workers < 1:
        raise UsageError(
            f"workers={workers} must be a multiple of {per_rack} (a rack); "
            f"use {max(per_rack, workers // per_rack * per_rack)}"
        )
    racks = workers // per_rack
    up = hosts_per_rack * host_mbit / oversubscription
    return ClusterSpec(
        name=f"rack-spine-{oversubscription:g}to1",
        racks=racks,
        hosts_per_rack=hosts_per_rack,
        workers_per_host=workers_per_host,
        host_rate_mbit=float(host_mbit),
        rack_uplink_mbit=float(up) if racks > 1 else None,
    )


def cluster_for(name_or_path: str, workers: int | None = None) -> ClusterSpec:
    """A shipped name, a topology file, or a generator name (``fat-tree``, ``rack-spine``).

    A generated fat-tree has 16-port switches up to 1,024 workers and the fewest ports that hold
    more; generators default to 64 workers.
    """
    if name_or_path in GENERATORS:
        n = 64 if workers is None else workers
        if name_or_path == "rack-spine":
            return rack_spine(n)
        return fat_tree(n, ports=16 if n <= 16**3 // 4 else _ports_for(n))
    try:
        spec = load_cluster(name_or_path)
    except ClusterSpecError as e:
        if "neither a file" not in str(e):
            raise UsageError(str(e)) from None
        names = ", ".join([*shipped_clusters(), *GENERATORS])
        raise UsageError(
            f"topology {name_or_path!r} is neither a file nor a known name; "
            f"use a topology file or one of: {names}"
        ) from None
    return spec if workers is None or workers == spec.world_size else scaled(spec, workers)


def to_toml(spec: ClusterSpec) -> str:
    """The topology file for ``spec`` (what :func:`dssync.lab.cluster.load_cluster` reads back)."""
    lines = [
        f'name = "{spec.name}"',
        "",
        "[cluster]",
        f"racks = {spec.racks}",
        f"hosts_per_rack = {spec.hosts_per_rack}",
        f"workers_per_host = {spec.workers_per_host}",
        f"host_rate_mbit = {spec.host_rate_mbit:g}",
    ]
    if spec.rack_uplink_mbit is not None and spec.racks > 1:
        lines.append(f"rack_uplink_mbit = {spec.rack_uplink_mbit:g}")
    for host, rate in sorted(spec.host_overrides.items()):
        lines += ["", "[[host_override]]", f"host = {host}", f"rate_mbit = {rate:g}"]
    for e in spec.events:
        when = f"at_s = {e.at_s:g}" if e.at_s is not None else f"at_fraction = {e.at_fraction:g}"
        lines += ["", "[[event]]", when, f'link = "{e.link}"', f"rate_mbit = {e.rate_mbit:g}"]
    return "\n".join(lines) + "\n"


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or v < 1:
            raise UsageError(f"{name}={v!r} must be a positive integer; e.g. 1")


def _ports_for(hosts: int) -> int:
    """The fewest ports per switch whose fat-tree holds ``hosts`` in whole edge switches."""
    k = 2
    while k**3 // 4 < hosts or hosts % (k // 2):
        k += 2
    return k
