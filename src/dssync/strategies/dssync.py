"""DS-Sync: average parameters inside small groups that change from averaging to averaging.

``DSSync`` is one class whose options compose: the schedule (the topology-aware plan included),
re-planning from timings (:mod:`~dssync.strategies.replan`), overlapped averages
(:mod:`~dssync.strategies.overlap`), local steps (``every``) and an outer optimizer
(:mod:`~dssync.strategies.outer`). Each option that acts around an averaging is a
:class:`~dssync.strategies.hooks.Hook`, called in a loop at the declared points of every
averaging; it uses only the public surface :class:`~dssync.strategies.hooks.Host` lists. A pair
of options that cannot work together is refused at construction.

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

from dssync.comm import FlatBuckets
from dssync.comm.agreement import check_module, check_start
from dssync.comm.align import align_rest
from dssync.comm.averager import Router
from dssync.comm.buckets import pack, plan_buckets
from dssync.comm.clock import module_device
from dssync.comm.exchange import broadcast_tensors, wait
from dssync.comm.tags import ALL, STEP, Tag
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.comm.wire import codec_for
from dssync.errors import UsageError
from dssync.schedules import Fragments, Schedule, default_schedule, group_of
from dssync.schedules.base import WHOLE, Part
from dssync.schedules.topology import DEFAULT_MAX_EVERY, plan_topology_aware
from dssync.strategies import sharded
from dssync.strategies.base import Strategy
from dssync.strategies.before_step import BeforeStep
from dssync.strategies.hooks import Averaging, Hook, Target, WireMemory
from dssync.strategies.options import Options, options_of
from dssync.strategies.outer import Outer
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
            tensors are re-laid into flat buckets). Or a model sharded with FSDP2's
            ``fully_shard`` over each replica's shards, with ``process_group`` the replicas'
            group (:mod:`~dssync.strategies.sharded`).
        schedule: which ranks average together at each averaging (default: random pairs,
            shuffled each time; :func:`~dssync.schedules.default_schedule`).
        optimizer: if given, its floating state (momentum, Adam moments) is averaged too, and
            with an Adam-family optimizer the gradients are averaged before it steps
            (``average_grads``); averaging every step that way, the moments stay per rank
            (parameters and gradients travel) and only ``average_all`` averages them.
        process_group: the ranks taking part (default: all); schedule ranks are ranks of it.
        options: an :class:`~dssync.Options` (default: all defaults).
        **settings: any field of :class:`~dssync.Options` (``every``, ``outer``, ``wire``,
            ``overlap``, ``topology``, ``replan``, ``fragments``, ``timeout_s``, ...), on top of
            ``options``. :attr:`options` holds what the instance runs with.

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
        optimizer: torch.optim.Optimizer | None = None,
        process_group: dist.ProcessGroup | None = None,
        options: Options | None = None,
        **settings: Any,
    ) -> None:
        Strategy.__init__(self, module, process_group)
        Joinable.__init__(self)
        check_module(module)
        sharded.refuse_fsdp1(module)
        self.sharded = sharded.is_sharded(module)  # local shards, copied in and out: sharded.py
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        if schedule is not None:
            settings = {**settings, "schedule": schedule}
        wanted = options_of(options, settings)
        self._refusal: str | None = None
        try:  # a value this rank refuses travels with the start-up agreement: all fail at once
            opts = wanted.check(optimizer)
            if self.sharded:
                sharded.check_sharded(module, opts, process_group)
        except UsageError as e:
            self._refusal = str(e)
            opts = Options(timeout_s=DEFAULT_TIMEOUT_S).check(None)
        if opts.topology is not None:
            schedule = plan_topology_aware(
                opts.topology, max_every=opts.replan or DEFAULT_MAX_EVERY
            )
        else:
            schedule = opts.schedule or default_schedule(self.world_size)
        self.options = opts
        self.schedule = Fragments(schedule, opts.fragments) if opts.fragments != 1 else schedule
        self.optimizer = optimizer
        self.steps = 0
        self.averagings = 0
        self._closed = False
        self._early = False  # this step's averaging ran inside the optimizer's step
        self._planned = self.schedule.describe()
        trainable = [p for p in module.parameters() if p.requires_grad]
        # The options acting around an averaging, called in this order at each hook point.
        self.hooks: list[Hook] = []
        if opts.average_grads:
            self.hooks.append(BeforeStep(self, optimizer, optimizer_params(module, optimizer)))
        if opts.outer is not None:
            self.hooks.append(Outer(trainable, opts.outer))
        extra = sharded.agreement(module) if self.sharded else {}
        check_start(self, {**opts.agreement(), **extra})
        self._buckets = FlatBuckets([] if self.sharded else self._tensors(), opts.bucket_bytes)
        first = self._buckets.buffers[0] if self._buckets.buffers else None
        device = None if first is None else first.device
        self.router = Router(
            process_group,
            self.schedule,
            opts.timeout_s,
            opts.bucket_bytes,
            pairs=opts.pairs,
            device=device,
            wire=opts.wire,
            inband=not opts.replan,  # re-planning times the transfer after the tags came apart
            nonfinite=opts.nonfinite,
        )
        self.router.names = self._name_at
        if opts.broadcast_init:
            with torch.no_grad():
                everything = sharded.locals_of([*module.parameters(), *module.buffers()])
                broadcast_tensors(everything, 0, process_group, opts.timeout_s, self.router.roll)
        for hook in self.hooks:
            hook.on_start(self)
        self.use_schedule(self.schedule)
        if opts.replan:
            at = module_device(module)
            self.hooks.append(Replanner(schedule, opts.replan, at, fragments=opts.fragments))
        if opts.overlap:
            self.hooks.append(
                Overlap(
                    process_group,
                    opts.timeout_s,
                    opts.bucket_bytes,
                    device,
                    self.router.groups,
                    wire=opts.wire,
                    residuals=self.router.residuals,
                    nonfinite=opts.nonfinite,
                )
            )
        if codec_for(opts.wire).name != "fp32":
            self.hooks.append(WireMemory(codec_for(opts.wire).name, self.router.residuals))

    # What the instance runs with, read from its options (set once, at construction).
    every = property(lambda self: self.options.every)
    replan = property(lambda self: self.options.replan)
    overlap = property(lambda self: self.options.overlap)
    wire = property(lambda self: codec_for(self.options.wire).name)
    fragments = property(lambda self: self.options.fragments)
    pairs = property(lambda self: self.options.pairs)
    nonfinite = property(lambda self: self.options.nonfinite)
    bucket_bytes = property(lambda self: self.options.bucket_bytes)
    timeout_s = property(lambda self: float(self.options.timeout_s))
    average_buffers = property(lambda self: self.options.average_buffers)
    average_frozen = property(lambda self: self.options.average_frozen)
    broadcast_init = property(lambda self: self.options.broadcast_init)

    def _hook(self, name: str) -> Any:
        return next((h for h in self.hooks if h.name == name), None)

    @property
    def outer(self) -> Outer | None:
        """The outer step's hook (``outer=``), or None."""
        return self._hook("outer")

    @property
    def replanner(self) -> Replanner | None:
        """The re-planning hook (``replan=``), or None."""
        return self._hook("replan")

    @property
    def before_step(self) -> BeforeStep | None:
        """The hook averaging inside the optimizer's step (``average_grads``), or None."""
        return next((h for h in self.hooks if isinstance(h, BeforeStep)), None)

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
        self._planned = plan.describe()
        self.use_schedule(plan)
        return True

    def _name_at(self, i: int, index: int) -> str:
        """The tensor at element ``index`` of averaged buffer ``i`` (for error messages)."""
        buffers = self._buckets.buffers
        if self.sharded:  # local shards, packed with the optimizer's state (sharded.py)
            return f"the local shards or optimizer state (packed buffer {i}, element {index})"
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

    def use_schedule(self, schedule: Schedule) -> None:
        """Average with ``schedule`` from the next averaging on (collective: every rank switches
        alike; makes the groups a repeating schedule needs, as at construction)."""
        self.schedule = schedule
        self.router.prepare(schedule)

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
        return any(h.defers and h.pending for h in self.hooks)

    def current_group(self) -> list[int]:
        """This rank's group at the next averaging."""
        return group_of(self.schedule.partition(self.averagings, self.world_size), self.rank)

    @torch.no_grad()
    def step(self) -> None:
        """Count an optimizer step; every ``every``-th one, average with this averaging's group."""
        early, self._early = self._early, False
        if not early:  # average_now() told the ranks that ran out of data (Join) already
            self._notify_join()
        self._step(averaged=early)

    @torch.no_grad()
    def average_now(self) -> None:
        """Run this step's averaging now, before :meth:`step` counts the step (what
        ``average_grads`` does inside ``optimizer.step()``); that :meth:`step` then only counts."""
        self._notify_join()  # a joined rank hears of the step before it serves the group
        self._sync()
        self._early = True

    def _notify_join(self) -> None:
        """Tell ranks that ran out of data (torch ``Join``) that this one takes a step."""
        work = Join.notify_join_context(self)
        if work is not None:
            wait(
                work,
                _deadline(self.timeout_s),
                Tag(STEP, self.averagings, 0),
                list(range(self.world_size)),
                self.timeout_s,
                what=f"the Join notification of optimizer step {self.steps + 1}",
                process_group=self.join_process_group,
            )

    def _step(self, averaged: bool = False) -> None:
        self.steps += 1
        if self.steps % self.every == 0 and not averaged:
            self._sync()

    def _sync(self) -> None:
        """One averaging, each hook called at its points (:mod:`dssync.strategies.hooks`)."""
        with self.syncing():
            t = self.averagings
            group = group_of(self.schedule.partition(t, self.world_size), self.rank)
            part = self.schedule.part(group, t, self.world_size) if len(group) > 1 else WHOLE
            deferred = any(h.defers for h in self.hooks)
            ctx = Averaging(self, t, group, part, deferred=deferred)
            if deferred:  # the previous averaging's mean lands first
                self.finish()
            for hook in self.hooks:
                hook.on_send(ctx)
            if not deferred:
                for hook in self.hooks:
                    hook.before_merge(self)
            if len(group) > 1:
                self._around(ctx, 0)
            if not deferred:
                for hook in self.hooks:
                    hook.after_merge(self)
            self.averagings += 1
            for hook in self.hooks:
                hook.after_average(ctx)

    def _around(self, ctx: Averaging, i: int) -> None:
        """Hook ``i``'s :meth:`~dssync.strategies.hooks.Hook.around` of the rest; the innermost
        is the blocking average."""
        if i == len(self.hooks):
            extra = [t for h in self.hooks for t in h.travels()]
            self._average(ctx.group, len(ctx.group), part=ctx.part, extra=extra)
        else:
            self.hooks[i].around(ctx, lambda: self._around(ctx, i + 1))

    @torch.no_grad()
    def finish(self) -> None:
        """Wait for the overlapped average in flight, if any, and merge it; with ``outer=``,
        apply the outer step it was due (one averaging late, :mod:`dssync.strategies.outer`)."""
        if not any(h.defers for h in self.hooks):
            return
        for hook in self.hooks:
            hook.before_merge(self)
        for hook in self.hooks:
            hook.merge(self)
        for hook in self.hooks:
            hook.after_merge(self)

    def targets(self) -> list[Target]:
        """Where a deferred mean lands: the flat buckets, then the optimizer's floating state as
        packed buffers (the order of :meth:`snapshot`)."""
        moments, ranged = self._optimizer_state()
        state = [
            *plan_buckets(moments, self.bucket_bytes),
            *plan_buckets(ranged, self.bucket_bytes),
        ]
        return [*self._fresh_buckets().buffers, *state]

    def close(self) -> None:
        """Finish and merge a pending average, stop the overlap lane's worker and destroy the
        groups made for the schedule (every rank; no more steps after; once is enough)."""
        if self._closed:
            return
        self._closed = True
        self.finish()
        self.router.settle()  # a verdict left on the device raises here, not never
        for hook in self.hooks:
            hook.close()
        self.router.close()  # the lane's router shares these groups

    @torch.no_grad()
    def average_all(self) -> None:
        """One global average over all ranks (e.g. for the final model); tagged apart from steps."""
        with self.syncing():
            self.finish()
            self._average(list(range(self.world_size)), self.world_size, kind=ALL)
            averaged = self._tensors() if self.sharded else self._buckets.tensors
            align_rest(self.module, averaged, self.process_group, self.timeout_s)
            for hook in self.hooks:
                hook.on_start(self)

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

    def snapshot(self) -> tuple[list[torch.Tensor], int]:
        """Copies of the buckets and the packed optimizer state, for an overlapped average, and
        how many of them at the end hold state that keeps its range on the wire."""
        moments, ranged = self._optimizer_state()
        snapshot = [b.clone() for b in self._fresh_buckets().buffers]
        snapshot += [flat for flat, _ in pack(moments, self.bucket_bytes)]
        kept = [flat for flat, _ in pack(ranged, self.bucket_bytes)]
        return snapshot + kept, len(kept)

    def _average(
        self,
        group: list[int],
        size: int,
        kind: int = STEP,
        part: Part = WHOLE,
        extra: list[torch.Tensor] | None = None,
    ) -> None:
        """Average buckets and optimizer state (``part`` of them), and ``extra`` tensors (what
        the hooks add: :meth:`~dssync.strategies.hooks.Hook.travels`), with ``group``."""
        if size < 2:
            return
        moments, ranged = self._optimizer_state() if self._state_travels(kind) else ([], [])
        self.router.average(
            group,
            kind,
            self.averagings,
            buffers=self._fresh_buckets().buffers,
            tensors=self._shards() + moments + sharded.locals_of(extra or []),
            part=part,
            ranged=ranged,
        )

    def _state_travels(self, kind: int) -> bool:
        """Whether an averaging sends the optimizer's state. Not a step's averaging when the
        gradients travel every step (``average_grads`` at ``every=1``, no outer step, no
        ``fragments``: each of those averages part of the way, and was not measured): the
        group's mean gradient and the second moment's correction keep each rank's moments close
        to DDP's, and the moments would double the bytes (``lm`` at 4 ranks, 3 seeds: +0.02% of
        DDP's validation loss without them, +0.30% with; docs/guide/adam.md). The global
        average (``average_all``) still sends them."""
        local = self.before_step is not None and self.every == 1 and self.outer is None
        local = local and self.fragments == 1
        return kind != STEP or not local

    def _shards(self) -> list[torch.Tensor]:
        """A sharded model's local shards (read afresh: FSDP2 may replace their storage)."""
        return sharded.locals_of(self._tensors()) if self.sharded else []

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
                    (moments if key in FIRST_MOMENTS else ranged).append(sharded.local(t))
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
        for hook in self.hooks:
            if hook.name:
                state[hook.name] = hook.state_dict()
        if self.replanner is None and (source := self._plan_source()) is not None:
            topology = source[0]  # a fixed plan: its rates
            state["planned_rates"] = {
                "host_mbit": {str(h): float(r) for h, r in topology.host_mbit.items()},
                "uplink_mbit": topology.uplink_mbit,
            }
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
                f"{self._planned}; resume with the same schedule= (type, group size and seed) "
                "and replan= (for a topology-aware plan, the same hosts and racks)"
            )
        for key in ("outer", "overlap", "replan"):
            if (key in state) != (self._hook(key) is not None):
                raise UsageError(
                    f"checkpoint was written {'with' if key in state else 'without'} {key}=, "
                    f"this run {'uses' if key not in state else 'does not use'} it; resume with "
                    "the same options (outer=, overlap=, replan=)"
                )
        self.finish()  # one already in flight completes so the group's messages stay matched
        self.steps = int(state["steps"])
        self.averagings = int(state.get("averagings", self.steps // self.every))
        saved = state.get("wire", {"format": "fp32"})
        if saved["format"] != self.wire:
            raise UsageError(
                f"checkpoint was written with wire={saved['format']}, this run uses "
                f"wire={self.wire}; resume with the same wire="
            )
        for hook in self.hooks:
            if hook.name:
                hook.load_state_dict(state[hook.name], self)


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
