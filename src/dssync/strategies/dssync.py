"""DS-Sync: average parameters inside small groups that change from step to step.

``DSSync`` is a thin layer over :class:`dssync.comm.averager.Router` (the averaging core that
``GroupAverager`` uses too): it keeps the model's tensors in flat buckets, adds floating buffers
and optimizer state to each average, agrees with the other ranks at start-up on everything that
shapes the collectives, and counts steps. It is a torch ``Joinable``: under
``with Join([sync]):`` a rank that runs out of data keeps serving its groups until all are done.
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
from dssync.comm.exchange import broadcast_tensors, wait
from dssync.comm.tags import ALL, STEP, Tag
from dssync.comm.wire import codec_for
from dssync.errors import UsageError
from dssync.schedules import Fragments, Schedule, Shuffle, group_of
from dssync.schedules.base import WHOLE, Part
from dssync.strategies.base import Strategy, SyncTimer


class DSSync(Strategy, Joinable):
    """Divide-and-shuffle synchronization of a module's parameters.

    Each rank takes its optimizer step on its own gradient; then :meth:`step` averages the
    parameters (and floating buffers such as batch-norm statistics) inside this step's group of
    ``schedule`` and moves on to the next step's partition. No process group is created after
    construction: pairs exchange point to point, a repeating schedule's larger groups are made once.

    Args:
        module: the plain model (not DDP-wrapped); move it to its device before wrapping (its
            tensors are re-laid into flat buckets).
        schedule: which ranks average together at each step (default: random pairs).
        process_group: the ranks taking part (default: all); schedule ranks are ranks of it.
        average_buffers: also average floating buffers (batch-norm running mean and variance).
        broadcast_init: start every rank from rank 0's parameters and buffers (integer and bool
            buffers included), as DDP does.
        optimizer: if given, its floating state (momentum, Adam moments) is averaged too.
        bucket_bytes: the largest flat buffer one collective moves.
        average_frozen: also average parameters with ``requires_grad=False`` (default: they are
            only broadcast from rank 0 at start, so they never drift).
        timeout_s: the longest any averaging waits for a peer before raising ``PeerLost``.
        pairs: how pairs average: ``"exchange"`` (point to point, no group per pair) or
            ``"all_reduce"`` (on pair groups made at construction; for comparison).
        wire: what travels: ``"fp32"`` (the buffers as kept), ``"bf16"``, ``"fp16"`` or
            ``"int8"`` (scaled per chunk), compressed with error feedback
            (:mod:`dssync.comm.wire` says what error remains); :meth:`average_all` is exact.
        fragments: average one of this many fragments of every buffer per step, in rotation
            (each coordinate once every ``fragments`` steps; :class:`~dssync.schedules.Fragments`).

    Example (run under ``torchrun --nproc-per-node 2`` or :func:`dssync.launch.spawn`)::

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
        process_group: dist.ProcessGroup | None = None,
        average_buffers: bool = True,
        broadcast_init: bool = True,
        optimizer: torch.optim.Optimizer | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        average_frozen: bool = False,
        pairs: str = "exchange",
        wire: str = "fp32",
        fragments: int = 1,
    ) -> None:
        Strategy.__init__(self, module, process_group)
        Joinable.__init__(self)
        check_module(module)
        self.schedule = schedule if schedule is not None else Shuffle(2)
        if fragments != 1:
            self.schedule = Fragments(self.schedule, fragments)
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.average_buffers = average_buffers
        self.average_frozen = average_frozen
        self.optimizer = optimizer
        self.bucket_bytes = bucket_bytes
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        self.steps = 0
        self.pairs = pairs
        self.wire = codec_for(wire).name  # an unknown format is refused here, with the list
        check_start(self)
        self._buckets = FlatBuckets(self._tensors(), bucket_bytes)
        first = self._buckets.buffers[0] if self._buckets.buffers else None
        self.router = Router(
            process_group,
            self.schedule,
            self.timeout_s,
            bucket_bytes,
            pairs=pairs,
            device=None if first is None else first.device,
            wire=wire,
        )
        if broadcast_init:
            with torch.no_grad():
                everything = list(module.parameters()) + list(module.buffers())
                broadcast_tensors(everything, 0, process_group, self.timeout_s, self.router.roll)
        self._prepare_cycle()

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

    def current_group(self) -> list[int]:
        """This rank's group at the current step."""
        return group_of(self.schedule.partition(self.steps, self.world_size), self.rank)

    @torch.no_grad()
    def step(self) -> None:
        """Average with this step's group, then advance to the next step's partition."""
        work = Join.notify_join_context(self)
        if work is not None:
            wait(
                work,
                _deadline(self.timeout_s),
                Tag(STEP, self.steps, 0),
                list(range(self.world_size)),
                self.timeout_s,
            )
        self._step()

    after_step = step

    def _step(self) -> None:
        with SyncTimer(self):
            partition = self.schedule.partition(self.steps, self.world_size)
            group = group_of(partition, self.rank)
            if len(group) > 1:
                self._average_group(group, self.schedule.part(group, self.steps, self.world_size))
            self.steps += 1
            self._advanced()

    def _average_group(self, group: list[int], part: Part = WHOLE) -> None:
        """Average ``part`` of the model with ``group`` (a subclass may time or wrap this)."""
        self._average(group, len(group), part=part)

    def _advanced(self) -> None:
        """Called after each step moved to the next partition (a subclass may re-plan here)."""

    @torch.no_grad()
    def average_all(self) -> None:
        """One global average over all ranks (e.g. for the final model); tagged apart from steps."""
        with SyncTimer(self):
            self._average(list(range(self.world_size)), self.world_size, kind=ALL)
            align_rest(self.module, self._buckets.tensors, self.process_group, self.timeout_s)

    def _average(self, group: list[int], size: int, kind: int = STEP, part: Part = WHOLE) -> None:
        """Average buckets and optimizer state (``part`` of them) with ``group``."""
        if size < 2:
            return
        if not self._buckets.intact():
            warnings.warn(
                "the module's tensors were replaced since DSSync wrapped it (e.g. by .to()); "
                "re-laying them into buckets. Move the model before wrapping to avoid this.",
                stacklevel=3,
            )
            self._buckets = FlatBuckets(self._tensors(), self.bucket_bytes)
        self.router.average(
            group,
            kind,
            self.steps,
            buffers=self._buckets.buffers,
            tensors=self._optimizer_state(),
            part=part,
        )

    def _optimizer_state(self) -> list[torch.Tensor]:
        if self.optimizer is None:
            return []
        state = self.optimizer.state  # walked in parameter order, the same on every rank
        return [
            t
            for g in self.optimizer.param_groups
            for p in g["params"]
            for _, t in sorted(state.get(p, {}).items())
            if torch.is_tensor(t) and t.is_floating_point() and t.dim() > 0
        ]

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
        """The synchronization state: the schedule step and, with a compressed wire, the error
        memory (save the module and optimizer yourself)."""
        state = {"steps": self.steps, "schedule": self.schedule.describe()}
        if self.wire != "fp32":
            state["wire"] = {"format": self.wire, **self.router.residuals.state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("schedule") != self.schedule.describe():
            raise UsageError(
                f"checkpoint was written with schedule {state.get('schedule')}, this run uses "
                f"{self.schedule.describe()}; resume with the same --schedule, --group-size and --seed"
            )
        self.steps = int(state["steps"])
        self._load_wire(state)

    def _load_wire(self, state: dict[str, Any]) -> None:
        saved = state.get("wire", {"format": "fp32"})
        if saved["format"] != self.wire:
            raise UsageError(
                f"checkpoint was written with wire={saved['format']}, this run uses "
                f"wire={self.wire}; resume with the same --wire"
            )
        if self.wire != "fp32":
            self.router.residuals.load_state_dict(saved)


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
