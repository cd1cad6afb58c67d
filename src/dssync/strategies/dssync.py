"""DS-Sync: average parameters inside small groups that change from step to step."""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm import (
    DEFAULT_BUCKET_BYTES,
    FlatBuckets,
    GroupCache,
    average_tensors,
    fingerprint_check,
)
from dssync.comm.consensus import module_fingerprint
from dssync.schedules import Schedule, Shuffle, group_of
from dssync.strategies.base import Strategy, SyncTimer


class DSSync(Strategy):
    """Divide-and-shuffle synchronization of a module's parameters.

    Each rank takes its optimizer step on its own gradient; then :meth:`step` averages the
    parameters (and floating buffers such as batch-norm statistics) inside this step's group of
    ``schedule`` and moves on to the next step's partition. Groups are created once and reused.

    Args:
        module: the model; move it to its device before wrapping (its tensors are re-laid into
            flat buckets).
        schedule: which ranks average together at each step (default: random pairs).
        process_group: the ranks taking part (default: all); schedule ranks are ranks of it.
        average_buffers: also average floating buffers (batch-norm running mean and variance).
        broadcast_init: start every rank from rank 0's parameters and buffers, as DDP does.
        optimizer: if given, its floating state (momentum, Adam moments) is averaged too.
        bucket_bytes: the largest flat buffer one collective moves.
        max_groups: the most process groups kept alive; older ones are destroyed.
        timeout_s: timeout of the process groups this creates.

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
    """

    name = "dssync"

    def __init__(self, module: nn.Module, schedule: Schedule | None = None,
                 process_group: dist.ProcessGroup | None = None, average_buffers: bool = True,
                 broadcast_init: bool = True, optimizer: torch.optim.Optimizer | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, max_groups: int = 128,
                 timeout_s: float | None = None) -> None:
        super().__init__(module, process_group)
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialized; call dist.init_process_group() first, "
                "or start the workers with `dssync train` or torchrun"
            )
        self.schedule = schedule if schedule is not None else Shuffle(2)
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.average_buffers = average_buffers
        self.optimizer = optimizer
        self.bucket_bytes = bucket_bytes
        self.steps = 0
        self.bytes_sent = 0
        self._check_agreement()
        self._buckets = FlatBuckets(self._tensors(), bucket_bytes)
        timeout = timedelta(seconds=timeout_s) if timeout_s else None
        self.groups = GroupCache(process_group, max_groups=max_groups, timeout=timeout)
        if broadcast_init:
            with torch.no_grad():
                self._buckets.broadcast(self._global_rank(0), group=process_group)
        self._prepare_cycle()

    def _tensors(self) -> list[torch.Tensor]:
        tensors = [p for p in self.module.parameters()]
        if self.average_buffers:
            tensors += [b for b in self.module.buffers() if b.is_floating_point()]
        return tensors

    def _global_rank(self, group_rank: int) -> int:
        if self.process_group is None:
            return group_rank
        return dist.get_global_rank(self.process_group, group_rank)

    def _check_agreement(self) -> None:
        named = list(self.module.named_parameters()) + list(self.module.named_buffers())
        fingerprint_check(
            {
                "model (parameter and buffer names, shapes, dtypes)": module_fingerprint(named),
                "schedule": self.schedule.fingerprint(self.world_size),
            },
            group=self.process_group,
            fixes={
                "model (parameter and buffer names, shapes, dtypes)":
                    "build the same model on every rank before wrapping it",
                "schedule": "give every rank the same schedule type, group size and seed",
            },
        )

    def _prepare_cycle(self) -> None:
        """Create every group of a repeating schedule up front when they fit in the cache."""
        cycle = self.schedule.cycle(self.world_size)
        if cycle is None:
            return
        partitions = [self.schedule.partition(s, self.world_size) for s in range(cycle)]
        distinct = {tuple(g) for p in partitions for g in p if 1 < len(g) < self.world_size}
        if len(distinct) <= self.groups.max_groups:
            for p in partitions:
                self.groups.prepare(p)

    @property
    def bucket_count(self) -> int:
        return len(self._buckets.buffers)

    def current_group(self) -> list[int]:
        """This rank's group at the current step."""
        return group_of(self.schedule.partition(self.steps, self.world_size), self.rank)

    @torch.no_grad()
    def step(self) -> None:
        """Average with this step's group, then advance to the next step's partition."""
        with SyncTimer(self):
            partition = self.schedule.partition(self.steps, self.world_size)
            self.groups.prepare(partition)
            group = group_of(partition, self.rank)
            if len(group) > 1:
                self._average_group(group)
            self.steps += 1
            self._advanced()

    after_step = step

    def _average_group(self, group: list[int]) -> None:
        """Average with ``group`` (a subclass may time or wrap this)."""
        self._average(self.groups.get(group), len(group))

    def _advanced(self) -> None:
        """Called after each step moved to the next partition (a subclass may re-plan here)."""

    @torch.no_grad()
    def average_all(self) -> None:
        """One global average over all ranks (e.g. for the final model)."""
        with SyncTimer(self):
            if self.world_size > 1:
                self._average(self.process_group, self.world_size)

    def _average(self, pg: dist.ProcessGroup | None, size: int) -> None:
        if not self._buckets.intact():
            warnings.warn(
                "the module's tensors were replaced since DSSync wrapped it (e.g. by .to()); "
                "re-laying them into buckets. Move the model before wrapping to avoid this.",
                stacklevel=3,
            )
            self._buckets = FlatBuckets(self._tensors(), self.bucket_bytes)
        self._buckets.average(pg, size)
        self.bytes_sent += self._buckets.nbytes
        if self.optimizer is not None:
            state = [t for s in self.optimizer.state.values() for t in s.values()
                     if torch.is_tensor(t) and t.is_floating_point() and t.dim() > 0]
            if state:
                average_tensors(state, pg, size, self.bucket_bytes)

    def state_dict(self) -> dict[str, Any]:
        """The synchronization state: the schedule step (save the module and optimizer yourself)."""
        return {"steps": self.steps, "schedule": self.schedule.describe()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("schedule") != self.schedule.describe():
            raise ValueError(
                f"checkpoint was written with schedule {state.get('schedule')}, this run uses "
                f"{self.schedule.describe()}; resume with the same --schedule, --group-size and --seed"
            )
        self.steps = int(state["steps"])
