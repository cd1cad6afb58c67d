"""Re-planning a topology-aware plan when a link slows down or recovers (``DSSync(replan=R)``).

Every rank times the transfer part of its group's averaging: from the moment every member's tag
has arrived (:attr:`~dssync.comm.averager.Router.arrived`, the tags ride the average itself),
so waiting for a late partner is not counted and no extra message is sent. Every ``replan``
averagings all ranks share a summary of those times in one all_reduce of a fixed-size tensor
(each rank fills its own row), compute the same new estimate of the topology from it, and, if
the plan changes, switch to the re-planned :class:`TopologyAware` schedule at the same averaging.

Data and metadata: the transfer is timed with :func:`dssync.comm.clock.clock`, which waits for
the device, so a GPU's asynchronous collectives are timed whole. The shared timings are float64
CPU metadata and go through the side group (:func:`dssync.comm.side.side_group`).

Sync time (the ``sync`` column) includes, every ``replan`` averagings, the timing exchange and
the re-plan. Overlap (``overlap=True``) hides the transfer these timings measure, so
:class:`~dssync.strategies.dssync.DSSync` refuses the two together.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dssync.comm.clock import clock
from dssync.comm.meta import bounded
from dssync.comm.side import side_group
from dssync.errors import UsageError
from dssync.schedules import Fragments, Schedule
from dssync.schedules.topology import TopologyAware, plan_topology_aware
from dssync.strategies.hooks import Averaging, Hook, Host
from dssync.topology import Topology

SLOW_ON, SLOW_OFF = 3.0, 1.5  # a host's best local sync vs the others': slow above, fast below
CROSS_ON, CROSS_OFF = 2.0, 1.5  # crossing vs local sync time: slow uplink above, fast below
NOMINAL_MBIT = 1000.0  # only ratios matter when no rate is known
MIN_SIGNAL_S = 0.002  # times are compared to at least this (timer noise of tiny syncs)
STAT_COLUMNS = 5  # median local, min local, median crossing, n local, n crossing


class Replanner(Hook):
    """Times a DSSync's averagings and re-plans its topology-aware schedule every ``period`` of
    them: a :class:`~dssync.strategies.hooks.Hook` (it switches plans through
    :meth:`Host.use_schedule <dssync.strategies.hooks.Host.use_schedule>`).

    ``schedule`` must come from :func:`plan_topology_aware` (it remembers the topology and the
    planner's settings; a re-plan repeats them with the re-estimated rates). ``min_signal_s``:
    sync times are compared to at least this, so timer noise of tiny syncs never looks like a
    slow link.

    Example (what ``DSSync(model, topology=topo, replan=8)`` does at named points)::

        replanner = Replanner(plan_topology_aware(topo, max_every=8), period=8, device=dev)
        replanner.around(ctx, average)         # times the transfer of average()
        replanner.after_average(ctx)           # after each averaging: re-plans every 8th
    """

    name = "replan"

    def __init__(
        self,
        schedule: TopologyAware,
        period: int,
        device: torch.device | None = None,
        min_signal_s: float = MIN_SIGNAL_S,
        fragments: int = 1,
    ) -> None:
        self.topology, self.settings = schedule.planned_from
        self.fragments = fragments
        self.period = period
        self.device = device
        self.min_signal_s = min_signal_s
        self.switches: list[tuple[int, str]] = []
        self._home = {r: d for d, dom in enumerate(self.topology.domains()) for r in dom}
        self._local: list[float] = []
        self._cross: list[float] = []

    def setup(self) -> str:
        """What shapes every plan but the rates: placement, planner settings, the re-plan period."""
        t, s = self.topology, self.settings
        return (
            f"hosts={list(t.hosts)} racks={list(t.racks)} group_size={s['group_size']} "
            f"seed={s['seed']} max_every={s['max_every']} replan={self.period} spread={s['spread']}"
            + (f" min_every={s['min_every']}" if s.get("min_every") is not None else "")
        )

    def plan(self, topology: Topology) -> Schedule:
        return plan_again(topology, self.settings, self.fragments)

    def around(self, ctx: Averaging, average: Callable[[], None]) -> None:
        """Average with the group, timing only the transfer (the device's work included).

        A slice's time is scaled to the whole model's (times the number of slices), so a spread
        crossing is compared with local syncs as a whole crossing would be.
        """
        t0 = clock(self.device)
        average()
        end = clock(self.device)
        came = ctx.host.router.arrived  # every member's tag checked: the rest is transfer
        spent = (end - max(t0, came if came is not None else t0)) * ctx.part[1]
        crosses = len({self._home[r] for r in ctx.group}) > 1
        (self._cross if crosses else self._local).append(spent)

    def after_average(self, ctx: Averaging) -> None:
        """After each averaging: every ``period``-th one shares timings and re-plans."""
        if ctx.host.averagings % self.period == 0:
            self.adjust(ctx.host)

    def adjust(self, sync: Host) -> None:
        """Share timings (one all_reduce on the side group), re-plan, switch plans if it changed."""
        stats = torch.zeros(sync.world_size, STAT_COLUMNS, dtype=torch.float64)
        stats[sync.rank] = torch.tensor(own_stats(self._local, self._cross), dtype=torch.float64)
        bounded(
            dist.all_reduce,
            stats,
            group=side_group(sync.process_group),
            timeout_s=sync.timeout_s,
            what="the re-planning timings",
        )
        self._local, self._cross = [], []
        self.topology = adjust_topology(self.topology, stats.numpy(), self.min_signal_s)
        if self._switch(sync):
            self.switches.append((sync.averagings, sync.schedule.describe()))

    def _switch(self, sync: Host) -> bool:
        plan = self.plan(self.topology)
        if plan.describe() == sync.schedule.describe():
            return False
        sync.use_schedule(plan)
        return True

    def state_dict(self) -> dict[str, Any]:
        """What re-planning learned: the estimated rates, the timings since the last adjustment
        and the switches, so a resumed run keeps its re-planned groups."""
        return {
            "setup": self.setup(),
            "host_mbit": {str(h): float(r) for h, r in self.topology.host_mbit.items()},
            "uplink_mbit": self.topology.uplink_mbit,
            "local": list(self._local),
            "cross": list(self._cross),
            "switches": [[s, d] for s, d in self.switches],
        }

    def load_state_dict(self, state: dict[str, Any], sync: Host) -> None:
        """Continue on the saved plan (every rank loads alike: collective when the plan changes)."""
        if state.get("setup") != self.setup():
            raise UsageError(
                f"checkpoint was written by topology-aware DS-Sync with {state.get('setup')}, "
                f"this run uses {self.setup()}; resume with the same hosts and racks, "
                "replan=, and the same group_size, seed, spread and min_every in "
                "plan_topology_aware"
            )
        rates = {int(h): float(r) for h, r in state["host_mbit"].items()}
        self.topology = self.topology.with_rates(rates, state["uplink_mbit"])
        self._local = [float(t) for t in state["local"]]
        self._cross = [float(t) for t in state["cross"]]
        self.switches = [(int(s), str(d)) for s, d in state["switches"]]
        self._switch(sync)


def plan_again(topology: Topology, settings: dict[str, Any], fragments: int = 1) -> Schedule:
    """The plan :func:`plan_topology_aware` makes for ``topology`` with the ``settings`` a plan
    remembers (``planned_from``), in ``fragments`` fragments when more than one: a re-plan, and
    a resumed fixed plan made again from its saved rates."""
    plan = plan_topology_aware(topology, **settings)
    return Fragments(plan, fragments) if fragments != 1 else plan


def own_stats(local: list[float], cross: list[float]) -> list[float]:
    """This rank's row: median and min local sync, median crossing sync, and the counts."""
    return [
        statistics.median(local) if local else 0.0,
        min(local) if local else 0.0,
        statistics.median(cross) if cross else 0.0,
        float(len(local)),
        float(len(cross)),
    ]


def adjust_topology(
    topology: Topology, stats: np.ndarray, min_signal_s: float = MIN_SIGNAL_S
) -> Topology:
    """The topology re-estimated from all ranks' rows (pure: every rank computes the same).

    A host whose ranks' best local sync is over SLOW_ON times the others' becomes slow (its rate
    scaled down by that factor); under SLOW_OFF it is fast again. Crossing syncs over CROSS_ON
    times local ones set the uplink rate by that ratio; under CROSS_OFF the uplink is as fast as a
    host link. In between, the previous estimate stands (hysteresis). Rows with no samples say
    nothing.
    """
    base = topology.local_mbit() or NOMINAL_MBIT
    host_mbit = {h: topology.host_mbit.get(h, base) for h in set(topology.hosts)}
    slow_now = set(topology.slow_ranks)
    has_local = [r for r in range(topology.world_size) if stats[r, 3] > 0]
    ref_pool = [stats[r, 1] for r in has_local if r not in slow_now] or [
        stats[r, 1] for r in has_local
    ]
    if ref_pool:
        ref = max(statistics.median(ref_pool), min_signal_s)
        worst: dict[int, float] = {}
        for r in has_local:
            h = topology.hosts[r]
            worst[h] = max(worst.get(h, 0.0), stats[r, 1] / ref)
        for h, ratio in worst.items():
            if ratio > SLOW_ON:
                host_mbit[h] = base / ratio
            elif ratio < SLOW_OFF:
                host_mbit[h] = base
    uplink = topology.uplink_mbit
    fast = [r for r in range(topology.world_size) if r not in slow_now]
    local = [stats[r, 0] for r in fast if stats[r, 3] > 0]
    cross = [stats[r, 2] for r in fast if stats[r, 4] > 0]
    if local and cross:
        rho = statistics.median(cross) / max(statistics.median(local), min_signal_s)
        if rho > CROSS_ON:
            uplink = base / rho
        elif rho < CROSS_OFF:
            uplink = base
    return topology.with_rates(host_mbit, uplink)
