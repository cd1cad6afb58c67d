"""The Topology value: host and rack of each rank, and what is known of link rates."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

SLOW_FRACTION = 0.5  # a host whose link is below half the median host rate is slow


@dataclass(frozen=True)
class Topology:
    """Host and rack of each rank; optional link rates (Mbit/s) and slow hosts.

    ``host_mbit`` maps a host to its link rate; ``uplink_mbit`` is the throughput available
    between racks (shared by every flow that crosses). Unknown rates are absent / None.

    Example::

        >>> t = Topology(hosts=(0, 0, 1, 1), racks=(0, 0, 1, 1))
        >>> t.num_hosts, t.ranks_in_rack(1)
        (2, [2, 3])
    """

    hosts: tuple[int, ...]
    racks: tuple[int, ...]
    host_mbit: dict[int, float] = field(default_factory=dict)
    uplink_mbit: float | None = None
    slow_hosts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.hosts) != len(self.racks):
            raise ValueError(
                f"hosts has {len(self.hosts)} entries but racks has {len(self.racks)}; "
                "give one host and one rack per rank"
            )
        for h in set(self.hosts):
            racks = {self.racks[r] for r in range(self.world_size) if self.hosts[r] == h}
            if len(racks) > 1:
                raise ValueError(f"host {h} is in racks {sorted(racks)}; a host sits in one rack")

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    @property
    def num_hosts(self) -> int:
        return len(set(self.hosts))

    @property
    def num_racks(self) -> int:
        return len(set(self.racks))

    def ranks_on_host(self, host: int) -> list[int]:
        return [r for r, h in enumerate(self.hosts) if h == host]

    def ranks_in_rack(self, rack: int) -> list[int]:
        return [r for r, k in enumerate(self.racks) if k == rack]

    @property
    def slow_ranks(self) -> tuple[int, ...]:
        return tuple(r for r, h in enumerate(self.hosts) if h in self.slow_hosts)

    def domains(self) -> list[list[int]]:
        """The fast neighbourhoods groups should stay inside: racks, else hosts, else all ranks.

        Racks when there is more than one; hosts when there is one rack but several hosts with
        several ranks each (the host link is then the bottleneck); otherwise one domain.
        """
        if self.num_racks > 1:
            return [self.ranks_in_rack(k) for k in sorted(set(self.racks))]
        per_host = self.world_size // max(self.num_hosts, 1)
        if self.num_hosts > 1 and per_host > 1:
            return [self.ranks_on_host(h) for h in sorted(set(self.hosts))]
        return [list(range(self.world_size))]

    def local_mbit(self) -> float | None:
        """The typical (median) host link rate, if known."""
        rates = [self.host_mbit[h] for h in sorted(set(self.hosts)) if h in self.host_mbit]
        return statistics.median(rates) if rates else None

    def with_rates(
        self, host_mbit: dict[int, float] | None = None, uplink_mbit: float | None = None
    ) -> Topology:
        """A copy with new rates; slow hosts are recomputed from the host rates."""
        hm = dict(self.host_mbit if host_mbit is None else host_mbit)
        return replace(self, host_mbit=hm, uplink_mbit=uplink_mbit, slow_hosts=slow_hosts_of(hm))

    def describe(self) -> str:
        rates = ", ".join(f"{h}:{v:.0f}" for h, v in sorted(self.host_mbit.items()))
        up = "?" if self.uplink_mbit is None else f"{self.uplink_mbit:.0f}"
        return (
            f"Topology({self.world_size} ranks, {self.num_hosts} hosts, {self.num_racks} racks, "
            f"host Mbit/s {{{rates}}}, uplink {up} Mbit/s, slow hosts {list(self.slow_hosts)})"
        )


def slow_hosts_of(host_mbit: dict[int, float]) -> tuple[int, ...]:
    """Hosts whose rate is below half the median host rate."""
    if not host_mbit:
        return ()
    med = statistics.median(host_mbit.values())
    return tuple(sorted(h for h, v in host_mbit.items() if v < SLOW_FRACTION * med))
