"""DS-Sync: average parameters inside small groups that change from averaging to averaging.

``DSSync`` is one class whose options compose: the schedule (the topology-aware plan included),
re-planning from timings (:mod:`~dssync.strategies.replan`), overlapped averages
(:mod:`~dssync.strategies.overlap`), local steps (``every``) and an outer optimizer
(:mod:`~dssync.strategies.outer`). Each option is a small object the class calls at named points
of an averaging; a pair that cannot work together is refused at construction.

The averaging core is :class:`dssync.comm.averager.Router` (``GroupAverager`` uses it too): the
model's tensors live in flat buckets, floating buffers and optimizer state join each average,
every rank agrees at start-up on everything that shapes the collectives, and steps are counted.
It is a torch ``Joinable``: under ``with Join([sync]):`` a rank that runs out of data keeps
serving its groups until all are done.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from dssync.comm import DEFAULT_BUCKET_BYTES, FlatBuckets
from dssync.comm.agreement import check_module, check_start
from dssync.comm.align import align_rest
from dssync.comm.averager import DEFAULT_TIMEOUT_S, Router
from dssync.comm.buckets import pack, plan_buckets
from dssync.comm.clock import module_device
from dssync.comm.exchange import broadcast_tensors, wait
from dssync.comm.tags import ALL, STEP, Tag
from dssync.comm.wire import codec_for
from dssync.errors import UsageError
from dssync.schedules import Fragments, Schedule, Shuffle, default_schedule, group_of
from dssync.schedules.base import WHOLE, Part
from dssync.schedules.topology import plan_topology_aware
from dssync.strategies.base import Strategy, SyncTimer
from dssync.strategies.before_step import BeforeStep, is_adaptive
from dssync.strategies.outer import Outer, OuterFactory
from dssync.strategies.overlap import Overlap
from dssync.strategies.replan import Replanner, plan_again
from dssync.topology import Topology

# Optimizer state that is a signed running mean of gradients: a compressed wire sends it as it
# sends the parameters. Any other floating state (Adam's second moment, Adagrad's sum, RMSprop's
# square average) spans many orders of magnitude and keeps its range (bf16 on an int8 wire).
FIRST_MOMENTS = ("momentum_buffer", "exp_avg")


def optimizer_params(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    """The optimizer's parameters in the module's order (matched by name, not by the
    optimizer's order), then any it holds that are not the module's, in the optimizer's order."""
    held = [p for g in optimizer.param_groups for p in g["params"]]
    ids = {id(p) for p in held}
    named = [p for p in module.parameters() if id(p) in ids]
    inside = {id(p) for p in named}
    return named + [p for p in held if id(p) not in inside]


class DSSync(Strategy, Joinable):
    """Divide-and-shuffle synchronization of a module's parameters, with options that compose.

    Each rank takes its optimizer step on its own gradient; every ``every``-th :meth:`step` then
    averages the parameters (and floating buffers such as batch-norm statistics) inside this
    averaging's group of ``schedule`` and moves on to the next partition. No process group is
    created after construction: pairs exchange point to point, a repeating schedule's larger
    groups are made once.

    Counting: :attr:`steps` counts optimizer steps (calls of :meth:`step`), :attr:`averagings`
    counts averagings. The schedule is indexed by averagings, so a topology-aware plan keeps its
    crossing cadence per averaging whatever ``every`` is, and ``replan`` counts averagings too.

    Args:
        module: the plain model (not DDP-wrapped); move it to its device before wrapping (its
            tensors are re-laid into flat buckets).
        schedule: which ranks average together at each averaging (default: random pairs; at an
            odd world size a pair and a rank alone, shuffled each time; above 16 ranks a cycle of
            2*ceil(log2 N) shuffles, so each rank meets a bounded set of peers:
            :func:`~dssync.schedules.default_schedule`).
        process_group: the ranks taking part (default: all); schedule ranks are ranks of it.
        optimizer: if given, its floating state (momentum, Adam moments) is averaged too.
        topology: hosts and racks of the ranks (:class:`~dssync.topology.Topology`): the schedule
            is then :func:`~dssync.schedules.topology.plan_topology_aware` of it, with crossings
            at most ``replan`` averagings apart (8 without re-planning). For other planner
            settings pass ``schedule=plan_topology_aware(...)`` instead.
        replan: re-plan the topology-aware plan every ``replan`` averagings from the measured
            sync times (0: never). Needs a plan made by ``plan_topology_aware`` (``topology=``).
        overlap: run each average behind the next steps' compute and merge it at the next
            averaging (``x <- mean(snapshot) + (x - snapshot)``). Not with ``replan`` (overlap
            hides the transfer times re-planning reads). With ``outer``, the outer step is
            applied one averaging late, when the mean arrives.
        every: average after every ``every``-th optimizer step (H); ranks train locally in
            between. 1 is DS-Sync as in the paper.
        outer: a factory ``params -> torch.optim.Optimizer`` for an outer optimizer applied to
            the pseudo-gradient at each averaging (:func:`~dssync.strategies.outer.nesterov`:
            DiLoCo's; with ``Global()`` this is DiLoCo; with ``overlap`` too, DiLoCo with its
            outer step one averaging late; see :mod:`dssync.strategies.outer`).
        average_buffers: also average floating buffers (batch-norm running mean and variance).
        broadcast_init: start every rank from rank 0's parameters and buffers (integer and bool
            buffers included), as DDP does.
        bucket_bytes: the largest flat buffer one collective moves.
        timeout_s: the longest any averaging waits for a peer before raising ``PeerLost``.
        average_frozen: also average parameters with ``requires_grad=False`` (default: they are
            only broadcast from rank 0 at start, so they never drift).
        pairs: how pairs average: ``"exchange"`` (point to point, no group per pair) or
            ``"all_reduce"`` (on pair groups made at construction; for comparison).
        wire: what travels: ``"fp32"`` (the buffers as kept), ``"bf16"``, ``"fp16"`` or
            ``"int8"`` (scaled per chunk), compressed with error feedback
            (:mod:`dssync.comm.wire` says what error remains); :meth:`average_all` is exact.
        average_grads: average inside ``optimizer.step()``, before it steps, with the gradients
            in the same message as the parameters and optimizer state
            (:mod:`~dssync.strategies.before_step`): in a pair, DDP's Adam step exactly. None
            (default): on for an Adam-family ``optimizer=`` (not with ``overlap``), whose second
            moment otherwise sees each rank's noisier gradient. Costs the gradients' bytes.
        fragments: average one of this many fragments of every buffer per averaging, in
            rotation (each coordinate once every ``fragments`` averagings;
            :class:`~dssync.schedules.Fragments`), for any schedule and with every option.
        nonfinite: when a member's values are not finite (NaN or Inf) no value leaves it and
            the group keeps its own values for that averaging; ``"raise"`` then raises
            ``SyncError`` on every member (the rank at fault names the tensor), ``"skip"``
            warns once and trains on (for runs whose loss scaling recovers on its own).

    Example (run under ``torchrun --nproc-per-node 2`` or :func:`dssync.lab.launch.spawn`)::

        import torch, torch.distributed as dist
        from dssync import DSSync, Shuffle
        dist.init_process_group("gloo")
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sync = DSSync(model, schedule=Shuffle(2, seed=0))
        for _ in range(10):
            model(torch.randn(4, 8)).sum().backward()
            opt.step(); opt.zero_grad()
            sync.step()
        sync.average_all()

    The options compose::

        DSSync(model, topology=detect(probe=True), replan=8)     # re-planned topology-aware
        DSSync(model, topology=topo, overlap=True)               # overlapped, fixed plan
        DSSync(model, schedule=Global(), every=500, outer=nesterov())   # DiLoCo
        DSSync(model, every=4, outer=nesterov())                 # DiLoCo inside shuffled pairs
        DSSync(model, topology=topo, wire="int8", fragments=4)   # a quarter of int8 per step

    With uneven data, ranks that run out keep serving their groups until every rank is done::

        from torch.distributed.algorithms.join import Join
        with Join([sync]):
            for x in my_batches:                 # a different count on each rank
                ...; opt.step(); sync.step()
        sync.average_all()
    """

    name = "dssync"

    def __init__(
        self,
        module: nn.Module,
        schedule: Schedule | None = None,
        *,
        process_group: dist.ProcessGroup | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        topology: Topology | None = None,
        replan: int = 0,
        overlap: bool = False,
        every: int = 1,
        outer: OuterFactory | None = None,
        average_buffers: bool = True,
        broadcast_init: bool = True,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        average_frozen: bool = False,
        pairs: str = "exchange",
        wire: str = "fp32",
        fragments: int = 1,
        nonfinite: str = "raise",
        average_grads: bool | None = None,
    ) -> None:
        Strategy.__init__(self, module, process_group)
        Joinable.__init__(self)
        check_module(module)
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self._refusal: str | None = None
        try:  # a value this rank refuses travels with the start-up agreement: all fail at once
            check_options(schedule, topology, replan, overlap, every, outer)
            average_grads = check_average_grads(average_grads, optimizer, overlap)
            codec_for(wire)
            Fragments(Shuffle(2), fragments)
            if nonfinite not in ("raise", "skip"):
                raise UsageError(f"nonfinite={nonfinite!r}: choose 'raise' or 'skip'")
        except UsageError as e:
            self._refusal = str(e)
            schedule, topology, replan, overlap, every, outer = None, None, 0, False, 1, None
            wire, fragments, nonfinite, average_grads = "fp32", 1, "raise", False
        if topology is not None:
            schedule = plan_topology_aware(topology, max_every=replan or 8)
        if schedule is None:
            schedule = default_schedule(self.world_size)
        self.fragments = fragments
        self.schedule = Fragments(schedule, fragments) if fragments != 1 else schedule
        self.average_buffers = average_buffers
        self.average_frozen = average_frozen
        self.broadcast_init = broadcast_init
        self.optimizer = optimizer
        self.bucket_bytes = bucket_bytes
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        self.every, self.replan, self.overlap = every, replan, overlap
        self.steps = 0
        self.averagings = 0
        self._closed = False
        self.pairs = pairs
        self.wire = codec_for(wire).name
        self.nonfinite = nonfinite
        self._planned = self.schedule.describe()
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.outer = None if outer is None else Outer(trainable, outer)
        self.before_step = (
            BeforeStep(self, optimizer, optimizer_params(module, optimizer))
            if average_grads
            else None
        )
        check_start(self)
        self._buckets = FlatBuckets(self._tensors(), bucket_bytes)
        first = self._buckets.buffers[0] if self._buckets.buffers else None
        device = None if first is None else first.device
        self.router = Router(
            process_group,
            self.schedule,
            self.timeout_s,
            bucket_bytes,
            pairs=pairs,
            device=device,
            wire=self.wire,
            inband=not replan,  # re-planning times the transfer after the tags came apart
            nonfinite=nonfinite,
        )
        self.router.names = self._name_at
        if broadcast_init:
            with torch.no_grad():
                everything = list(module.parameters()) + list(module.buffers())
                broadcast_tensors(everything, 0, process_group, self.timeout_s, self.router.roll)
        if self.outer is not None:
            self.outer.reset()
        self._prepare_cycle()
        self.replanner = (
            Replanner(schedule, replan, module_device(module), fragments=fragments)
            if replan
            else None
        )
        self._overlap = (
            Overlap(
                process_group,
                self.timeout_s,
                bucket_bytes,
                device,
                self.router.groups,
                wire=self.wire,
                residuals=self.router.residuals,
                nonfinite=nonfinite,
            )
            if overlap
            else None
        )

    def _plan_source(self) -> tuple[Topology, dict[str, Any]] | None:
        """The topology and planner settings this run's plan was made from (None: not planned)."""
        plan = self.schedule.schedule if isinstance(self.schedule, Fragments) else self.schedule
        return getattr(plan, "planned_from", None)

    def _replay(self, state: dict[str, Any]) -> bool:
        """Switch to the fixed plan ``state`` was saved on, made again from its saved rates;
        False when that cannot give the saved plan (another placement or settings)."""
        source, saved = self._plan_source(), state.get("planned_rates")
        if source is None or saved is None:
            return False
        topology, settings = source
        rates = {int(h): float(r) for h, r in saved["host_mbit"].items()}
        plan = plan_again(topology.with_rates(rates, saved["uplink_mbit"]), settings)
        if isinstance(self.schedule, Fragments):  # wrapped as before, Fragments(plan, 1) too
            plan = Fragments(plan, self.schedule.fragments)
        if plan.describe() != state.get("schedule"):
            return False
        self.schedule, self._planned = plan, plan.describe()
        self._prepare_cycle()
        return True

    def _name_at(self, i: int, index: int) -> str:
        """The tensor at element ``index`` of averaged buffer ``i`` (for error messages)."""
        buffers = self._buckets.buffers
        if i >= len(buffers):
            return f"the optimizer's state (packed buffer {i - len(buffers)}, element {index})"
        at = buffers[i].data_ptr() + index * buffers[i].element_size()
        named = [*self.module.named_parameters(), *self.module.named_buffers()]
        for name, t in named:
            if t.data_ptr() <= at < t.data_ptr() + t.numel() * t.element_size():
                flat = (at - t.data_ptr()) // t.element_size()
                return f"{name} (element {flat} of shape {tuple(t.shape)}, bucket {i})"
        return f"bucket {i}, element {index}"

    def _tensors(self) -> list[torch.Tensor]:
        tensors = [p for p in self.module.parameters() if p.requires_grad or self.average_frozen]
        if self.average_buffers:
            tensors += [b for b in self.module.buffers() if b.is_floating_point()]
        return tensors

    def _prepare_cycle(self) -> None:
        """Make the groups a repeating schedule needs (collective; construction and re-plans only)."""
        self.router.prepare(self.schedule)

    @property
    def bucket_count(self) -> int:
        return len(self._buckets.buffers)

    @property
    def groups_created(self) -> int:
        """Process groups this wrapper has created (none after construction for its own schedules)."""
        return self.router.created

    @property
    def switches(self) -> list[tuple[int, str]]:
        """Re-plans so far: (averaging, schedule description), alike on every rank."""
        return [] if self.replanner is None else self.replanner.switches

    @property
    def pending(self) -> bool:
        """True while an overlapped average is started or arrived but not yet merged."""
        return self._overlap is not None and self._overlap.pending

    def current_group(self) -> list[int]:
        """This rank's group at the next averaging."""
        return group_of(self.schedule.partition(self.averagings, self.world_size), self.rank)

    @torch.no_grad()
    def step(self) -> None:
        """Count an optimizer step; every ``every``-th one, average with this averaging's group."""
        if self.before_step is None or not self.before_step.notified():  # once a step
            self._notify_join()
        self._step()

    def _notify_join(self) -> None:
        """Tell ranks that ran out of data (torch ``Join``) that this one takes a step."""
        work = Join.notify_join_context(self)
        if work is not None:
            wait(
                work,
                _deadline(self.timeout_s),
                Tag(STEP, self.steps, 0),
                list(range(self.world_size)),
                self.timeout_s,
                process_group=self.join_process_group,
            )

    def _step(self) -> None:
        self.steps += 1
        if self.steps % self.every == 0:
            if self.before_step is None:
                self._sync()
            elif not self.before_step.taken():  # no optimizer step here (joined): zero gradients
                self.before_step.average(zeros=True)

    def _sync(self) -> None:
        """One averaging: merge or average, the outer step, then re-planning, at these points."""
        with SyncTimer(self):
            t = self.averagings
            group = group_of(self.schedule.partition(t, self.world_size), self.rank)
            part = self.schedule.part(group, t, self.world_size) if len(group) > 1 else WHOLE
            if self._overlap is not None:
                self.finish()
                if self.outer is not None:
                    self.outer.send()
                if len(group) > 1:
                    snapshot, ranged = self._snapshot()
                    self._overlap.start(group, t, snapshot, part, ranged=ranged)
            else:
                if len(group) > 1:
                    self._average_group(group, part)
                if self.outer is not None:
                    self.outer.apply()
            self.averagings += 1
            if self.replanner is not None:
                self.replanner.after(self)

    def _average_group(self, group: list[int], part: Part = WHOLE) -> None:
        """Average ``part`` of the model with ``group`` (timed when re-planning)."""
        if self.replanner is not None:
            self.replanner.timed(self, group, part)
        else:
            self._average(group, len(group), part=part)

    @torch.no_grad()
    def finish(self) -> None:
        """Wait for the overlapped average in flight, if any, and merge it; with ``outer=``,
        apply the outer step it was due (one averaging late,
        :meth:`dssync.strategies.outer.Outer.apply_late`)."""
        if self._overlap is None:
            return
        late = self.outer is not None and self.outer.sent is not None
        if late:
            self.outer.progress()
        moments, ranged = self._optimizer_state()
        state = [
            *plan_buckets(moments, self.bucket_bytes),
            *plan_buckets(ranged, self.bucket_bytes),
        ]
        self._overlap.finish([*self._fresh_buckets().buffers, *state], self.averagings)
        if late:
            self.outer.apply_late()

    def close(self) -> None:
        """Finish and merge a pending average, stop the overlap lane's worker and destroy the
        groups made for the schedule (every rank; no more steps after; once is enough)."""
        if self._closed:
            return
        self._closed = True
        self.finish()
        self.router.settle()  # a verdict left on the device raises here, not never
        if self.before_step is not None:
            self.before_step.close()
        if self._overlap is not None:
            self._overlap.close()
            dist.destroy_process_group(self._overlap.lane.group)
        self.router.close()  # the lane's router shares these groups

    @torch.no_grad()
    def average_all(self) -> None:
        """One global average over all ranks (e.g. for the final model); tagged apart from steps."""
        with SyncTimer(self):
            self.finish()
            self._average(list(range(self.world_size)), self.world_size, kind=ALL)
            align_rest(self.module, self._buckets.tensors, self.process_group, self.timeout_s)
            if self.outer is not None:
                self.outer.reset()

    def _fresh_buckets(self) -> FlatBuckets:
        """The flat buckets, re-laid (with a warning) if the module's tensors were replaced."""
        if not self._buckets.intact():
            warnings.warn(
                "the module's tensors were replaced since DSSync wrapped it (e.g. by .to()); "
                "re-laying them into buckets. Move the model before wrapping to avoid this.",
                stacklevel=4,
            )
            self._buckets = FlatBuckets(self._tensors(), self.bucket_bytes)
        return self._buckets

    def _snapshot(self) -> tuple[list[torch.Tensor], int]:
        """Copies of the buckets and the packed optimizer state, for an overlapped average, and
        how many of them at the end hold state that keeps its range on the wire."""
        moments, ranged = self._optimizer_state()
        snapshot = [b.clone() for b in self._fresh_buckets().buffers]
        snapshot += [flat for flat, _ in pack(moments, self.bucket_bytes)]
        kept = [flat for flat, _ in pack(ranged, self.bucket_bytes)]
        return snapshot + kept, len(kept)

    def _average(self, group: list[int], size: int, kind: int = STEP, part: Part = WHOLE) -> None:
        """Average buckets and optimizer state (``part`` of them) with ``group``."""
        if size < 2:
            return
        moments, ranged = self._optimizer_state()
        self.router.average(
            group,
            kind,
            self.averagings,
            buffers=self._fresh_buckets().buffers,
            tensors=moments + self._grads(),
            part=part,
            ranged=ranged,
        )

    def _grads(self) -> list[torch.Tensor]:
        return [] if self.before_step is None else self.before_step.grads()

    def _optimizer_state(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The optimizer's floating state to average, matched by parameter name: walked in the
        module's parameter order (the same on every rank, whatever order the optimizer holds
        them in), then any parameters outside the module in the optimizer's order. Returns the
        first moments (:data:`FIRST_MOMENTS`, sent as the parameters are) and the rest, which
        keeps its range on a compressed wire (Adam's second moment; ``Router.average``'s
        ``ranged=``)."""
        if self.optimizer is None:
            return [], []
        moments: list[torch.Tensor] = []
        ranged: list[torch.Tensor] = []
        state = self.optimizer.state
        for p in optimizer_params(self.module, self.optimizer):
            for key, t in sorted(state.get(p, {}).items()):
                if torch.is_tensor(t) and t.is_floating_point() and t.dim() > 0:
                    (moments if key in FIRST_MOMENTS else ranged).append(t)
        return moments, ranged

    # torch Join: a rank out of data keeps taking its part in its groups until every rank is done.
    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _ServeGroups(self)

    @property
    def join_device(self) -> torch.device:
        return next((p.device for p in self.module.parameters()), torch.device("cpu"))

    @property
    def join_process_group(self) -> Any:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def state_dict(self) -> dict[str, Any]:
        """The synchronization state (save the module and optimizer yourself): the step and
        averaging counts, and each option's own state (outer anchors and optimizer, the pending
        overlapped average, what re-planning learned). Saving does not change the run."""
        state: dict[str, Any] = {
            "steps": self.steps,
            "averagings": self.averagings,
            "schedule": self._planned,
        }
        if self.outer is not None:
            state["outer"] = self.outer.state_dict()
        if self._overlap is not None:
            state["overlap"] = self._overlap.state_dict()
        if self.replanner is not None:
            state["replan"] = self.replanner.state_dict()
        elif (source := self._plan_source()) is not None:  # a fixed plan: its rates
            topology = source[0]
            state["planned_rates"] = {
                "host_mbit": {str(h): float(r) for h, r in topology.host_mbit.items()},
                "uplink_mbit": topology.uplink_mbit,
            }
        if self.wire != "fp32":
            state["wire"] = {"format": self.wire, **self.router.residuals.state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` was saved (every rank loads alike: collective on a re-plan).

        A topology-aware run's groups come from the saved rates, not from this run's first
        plan, which a new probe may have made from other rates: a re-planned run's re-planner
        checks the hosts, racks and settings; a fixed plan is made again from the saved rates
        with this run's placement and settings, and must come out as the saved one."""
        replanned = self.replanner is not None and "replan" in state
        if not replanned and state.get("schedule") != self._planned and not self._replay(state):
            raise UsageError(
                f"checkpoint was written with schedule {state.get('schedule')}, this run uses "
                f"{self._planned}; resume with the same --schedule, --group-size, --seed and "
                "--replan (for a topology-aware plan, the same hosts and racks)"
            )
        for key, on in (
            ("outer", self.outer),
            ("overlap", self._overlap),
            ("replan", self.replanner),
        ):
            if (key in state) != (on is not None):
                raise UsageError(
                    f"checkpoint was written {'with' if key in state else 'without'} {key}=, "
                    f"this run {'uses' if on is not None else 'does not use'} it; resume with "
                    "the same options (--outer, --overlap, --replan)"
                )
        self.finish()  # one already in flight completes so the group's messages stay matched
        self.steps = int(state["steps"])
        self.averagings = int(state.get("averagings", self.steps // self.every))
        saved = state.get("wire", {"format": "fp32"})
        if saved["format"] != self.wire:
            raise UsageError(
                f"checkpoint was written with wire={saved['format']}, this run uses "
                f"wire={self.wire}; resume with the same --wire"
            )
        if self.wire != "fp32":
            self.router.residuals.load_state_dict(saved)
        if self.outer is not None:
            self.outer.load_state_dict(state["outer"])
        if self._overlap is not None:
            self._overlap.load_state_dict(state["overlap"])
        if self.replanner is not None:
            self.replanner.load_state_dict(state["replan"], self)


def check_options(
    schedule: Schedule | None,
    topology: Topology | None,
    replan: int,
    overlap: bool,
    every: int,
    outer: OuterFactory | None,
) -> None:
    """Refuse a value or a pair of DSSync's options that cannot work, naming why and the fix."""
    if every < 1:
        raise UsageError(f"every={every} must be >= 1 (optimizer steps per averaging); try 1 or 4")
    if replan < 0:
        raise UsageError(f"replan={replan} must be >= 0 (averagings between re-plans; 0: off)")
    if topology is not None and schedule is not None:
        raise UsageError(
            "pass topology= or schedule=, not both: topology= makes the schedule "
            "(plan_topology_aware(topology)); for other planner settings pass that schedule"
        )
    if replan and topology is None and getattr(schedule, "planned_from", None) is None:
        raise UsageError(
            f"replan={replan} re-plans a topology-aware plan, but the schedule is "
            f"{'the default' if schedule is None else schedule.describe()}; pass topology= "
            "(or schedule=plan_topology_aware(...)), or replan=0"
        )
    if overlap and replan:
        raise UsageError(
            "overlap=True with replan: an overlapped average hides its transfer time, which is "
            "what re-planning measures; use one of them (replan=0, or overlap=False)"
        )
    if outer is not None and not callable(outer):
        raise UsageError(
            f"outer= must be a factory params -> torch.optim.Optimizer, not {type(outer).__name__}; "
            "try outer=dssync.nesterov()"
        )


def check_average_grads(
    average_grads: bool | None, optimizer: torch.optim.Optimizer | None, overlap: bool
) -> bool:
    """Whether to average at the optimizer's step; None: yes for an Adam-family ``optimizer``."""
    if average_grads is None:
        return is_adaptive(optimizer) and not overlap
    if average_grads and optimizer is None:
        raise UsageError(
            "average_grads=True averages at the optimizer's step; pass optimizer= (the one "
            "whose step() follows backward), or average_grads=False"
        )
    if average_grads and overlap:
        raise UsageError(
            "average_grads=True averages before the optimizer steps, overlap=True behind the "
            "next steps; use one of them (average_grads=False, or overlap=False)"
        )
    return bool(average_grads)


class _ServeGroups(JoinHook):
    """While other ranks still train, a joined rank takes each step's part in its group."""

    def __init__(self, sync: DSSync) -> None:
        self.sync = sync

    def main_hook(self) -> None:
        with torch.no_grad():
            self.sync._step()


def _deadline(timeout_s: float) -> float:
    import time

    return time.monotonic() + timeout_s
