"""DS-Sync with topology-aware groups that re-plans when a link slows down or recovers.

Every rank times the transfer part of its group's sync at each step: from the moment every
member's tag has arrived (:attr:`~dssync.comm.exchange.Exchange.arrived`, the tags ride the
average itself), so waiting for a late partner is not counted and no extra message is sent. Every
``replan_every`` steps all ranks share a summary of those times in one all_reduce of a fixed-size
tensor (each rank fills its own row), compute the same new estimate of the topology from it,
and, if the plan changes, switch to the re-planned :class:`TopologyAware` schedule at the same step.

Data and metadata: the transfer is timed with :func:`dssync.comm.clock.clock`, which waits for
the device, so a GPU's asynchronous collectives are timed whole. The shared timings are float64
CPU metadata and go through the side group (:func:`dssync.comm.side.side_group`).

Sync time (the ``sync`` column): as for :class:`DSSync`, the wall time of :meth:`step`, which runs
after the optimizer step and so never overlaps backward: choosing the group, the
averaging itself (waited for), and every ``replan_every`` steps the timing exchange and re-plan.
(An earlier version lined each group up with a one-element exchange before the timed average;
on the emulated S1 that round trip cost about a tenth of an iteration.)
"""

from __future__ import annotations

import statistics

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dssync.comm.clock import clock, module_device
from dssync.comm.side import side_group
from dssync.errors import UsageError
from dssync.schedules.base import WHOLE, Part
from dssync.schedules.topology import SPREAD, TopologyAware, plan_topology_aware
from dssync.strategies.dssync import DSSync
from dssync.topology import Topology

SLOW_ON, SLOW_OFF = 3.0, 1.5  # a host's best local sync vs the others': slow above, fast below
CROSS_ON, CROSS_OFF = 2.0, 1.5  # crossing vs local sync time: slow uplink above, fast below
NOMINAL_MBIT = 1000.0  # only ratios matter when no rate is known
MIN_SIGNAL_S = 0.002  # times are compared to at least this (timer noise of tiny syncs)
STAT_COLUMNS = 5  # median local, min local, median crossing, n local, n crossing


class AdaptiveDSSync(DSSync):
    """DS-Sync on a :class:`TopologyAware` schedule, re-planned every ``replan_every`` steps from timings.

    Args:
        module: the model (see :class:`DSSync`).
        topology: hosts and racks of the ranks, with rates if known (default: ``detect()``).
        replan_every: steps between adjustments (R); also the longest planned gap between
            crossings.
        group_size, seed: passed to the planner.
        min_signal_s: sync times are compared to at least this, so timer noise of tiny syncs
            never looks like a slow link.
        spread: spread crossings and slow hosts' syncs over the steps, a slice of the model at a
            time (see :class:`TopologyAware`); ``False`` sends them whole every few steps.
        **kwargs: passed to :class:`DSSync` (optimizer, bucket_bytes, timeout_s, ...).

    Example (under torchrun or :func:`dssync.launch.spawn`)::

        from dssync.topology import detect
        sync = AdaptiveDSSync(model, detect(probe=True), replan_every=8)
        for batch in loader:
            ...; optimizer.step(); sync.step()
        sync.switches      # [(step, schedule description), ...] on every rank alike
    """

    name = "dssync-topo"

    def __init__(
        self,
        module: nn.Module,
        topology: Topology | None = None,
        replan_every: int = 8,
        group_size: int = 2,
        seed: int = 0,
        min_signal_s: float = MIN_SIGNAL_S,
        spread: bool = SPREAD,
        **kwargs,
    ) -> None:
        if replan_every < 1:
            raise UsageError(
                f"replan_every={replan_every} must be >= 1 (steps between adjustments); try 8"
            )
        if topology is None:
            from dssync.topology import detect

            topology = detect()
        self.topology = topology
        self.replan_every = replan_every
        self.group_size = group_size
        self.seed = seed
        self.min_signal_s = min_signal_s
        self.spread = spread
        super().__init__(module, schedule=self._plan(topology), **kwargs)
        self.switches: list[tuple[int, str]] = []
        self._home = {r: d for d, dom in enumerate(topology.domains()) for r in dom}
        self._local: list[float] = []
        self._cross: list[float] = []
        self.device = module_device(module)

    def _setup(self) -> str:
        """What shapes every plan but the rates: placement, group size, seed, replan_every."""
        t = self.topology
        return (
            f"hosts={list(t.hosts)} racks={list(t.racks)} group_size={self.group_size} "
            f"seed={self.seed} replan_every={self.replan_every} spread={self.spread}"
        )

    def _plan(self, topology: Topology) -> TopologyAware:
        return plan_topology_aware(
            topology, self.group_size, self.seed, max_every=self.replan_every, spread=self.spread
        )

    def _average_group(self, group: list[int], part: Part = WHOLE) -> None:
        """Average with the group, timing only the transfer (the device's work included).

        A slice's time is scaled to the whole model's (times the number of slices), so a spread
        crossing is compared with local syncs as a whole crossing would be.
        """
        t0 = clock(self.device)
        self._average(group, len(group), part=part)
        end = clock(self.device)
        came = self.router.arrived  # every member's tag checked: the rest is transfer
        spent = (end - max(t0, came if came is not None else t0)) * part[1]
        crosses = len({self._home[r] for r in group}) > 1
        (self._cross if crosses else self._local).append(spent)

    def _advanced(self) -> None:
        if self.steps % self.replan_every == 0:
            self.adjust()

    def adjust(self) -> None:
        """Share timings (one all_reduce on the side group), re-plan, switch plans if it changed."""
        stats = torch.zeros(self.world_size, STAT_COLUMNS, dtype=torch.float64)
        stats[self.rank] = torch.tensor(own_stats(self._local, self._cross), dtype=torch.float64)
        dist.all_reduce(stats, group=side_group(self.process_group))
        self._local, self._cross = [], []
        self.topology = adjust_topology(self.topology, stats.numpy(), self.min_signal_s)
        plan = self._plan(self.topology)
        if plan.describe() != self.schedule.describe():
            self.schedule = plan
            self._prepare_cycle()
            self.switches.append((self.steps, plan.describe()))

    def state_dict(self) -> dict:
        """The step plus what re-planning learned: the estimated rates, the timings since the
        last adjustment and the switches, so a resumed run keeps its re-planned groups."""
        return {
            "steps": self.steps,
            "setup": self._setup(),
            "host_mbit": {str(h): float(r) for h, r in self.topology.host_mbit.items()},
            "uplink_mbit": self.topology.uplink_mbit,
            "local": list(self._local),
            "cross": list(self._cross),
            "switches": [[s, d] for s, d in self.switches],
            **{k: v for k, v in super().state_dict().items() if k == "wire"},
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue at the saved step on the saved plan (every rank loads alike: collective)."""
        saved = state.get("setup")
        if saved is not None and "spread=" not in saved:
            saved += " spread=False"  # written before crossings were spread
        if saved is not None and saved != self._setup():
            raise UsageError(
                f"checkpoint was written by topology-aware DS-Sync with {saved}, this run "
                f"uses {self._setup()}; resume with the same hosts and racks, --group-size, "
                "--seed and --replan-every (spread=False: --sync dssync-topo-whole)"
            )
        self.steps = int(state["steps"])
        self._load_wire(state)
        if "host_mbit" not in state:  # a checkpoint from before re-plans were saved
            return
        rates = {int(h): float(r) for h, r in state["host_mbit"].items()}
        self.topology = self.topology.with_rates(rates, state["uplink_mbit"])
        self._local = [float(t) for t in state["local"]]
        self._cross = [float(t) for t in state["cross"]]
        self.switches = [(int(s), str(d)) for s, d in state["switches"]]
        plan = self._plan(self.topology)
        if plan.describe() != self.schedule.describe():
            self.schedule = plan
            self._prepare_cycle()


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
