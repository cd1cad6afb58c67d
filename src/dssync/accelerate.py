"""Accelerate: DS-Sync in a training loop prepared by ``accelerate``, shaped like its ``LocalSGD``.

Inside ``with DSSyncLocal(accelerator, model, schedule) as ds:`` the DDP wrapper's gradient
all-reduce is off (``accelerator.no_sync``); ``ds.step()`` after each optimizer step averages the
parameters inside that step's group, and leaving the block averages over all ranks so every rank
holds the same model. Needs ``pip install 'dssync[accelerate]'``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from accelerate import Accelerator, DistributedType
from torch import nn

from dssync import DSSync, Schedule
from dssync.errors import UsageError
from dssync.strategies.options import Options, options_of
from dssync.strategies.sharded import refuse_in_door

_SHARDED = {
    DistributedType.DEEPSPEED,
    DistributedType.FSDP,
    DistributedType.MEGATRON_LM,
    DistributedType.XLA,
}


class DSSyncLocal:
    """Train on local gradients and average in changing groups after each optimizer step.

    Args:
        accelerator: the ``Accelerator`` that prepared ``model``.
        model: the prepared model (wrapped in DDP when there are several processes).
        schedule: which ranks average together at each averaging (default: :class:`DSSync`'s).
        optimizer: if given, its floating state (momentum, Adam moments) is averaged too (after
            an Adam-family optimizer averaging every step, only at ``average_all``).
        enabled: ``False`` leaves DDP as it is and makes :meth:`step` do nothing.
        options: a :class:`dssync.Options` (default: all defaults).
        **settings: any field of :class:`dssync.Options`, the same names and meaning as
            ``DSSync``'s (``every=4, outer=dssync.nesterov()``: DiLoCo in the groups).

    Example (``torchrun --nproc-per-node 2 train.py``; ``Accelerator(cpu=True)`` on CPUs)::

        accelerator = Accelerator()
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        with DSSyncLocal(accelerator, model, Shuffle(2, seed=0)) as ds:
            for x, y in loader:
                accelerator.backward(loss_fn(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
                ds.step()
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        schedule: Schedule | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        enabled: bool = True,
        *,
        options: Options | None = None,
        **settings: Any,
    ) -> None:
        if accelerator.distributed_type in _SHARDED:
            raise UsageError(
                f"DSSyncLocal needs every rank to hold the whole model, and "
                f"{accelerator.distributed_type.value} shards it; use plain data "
                "parallelism (accelerate launch without DeepSpeed, FSDP or Megatron)"
            )
        refuse_in_door(model, "DSSyncLocal")
        if schedule is not None and not isinstance(schedule, Schedule):
            raise UsageError(
                f"schedule={schedule!r} is not a dssync schedule; "
                "pass one such as dssync.Shuffle(2, seed=0)"
            )
        self.accelerator = accelerator
        self.options = options_of(options, settings)  # a wrong name is refused even when disabled
        self.model = model
        self.enabled = enabled and accelerator.num_processes > 1
        self.sync: DSSync | None = None
        if self.enabled:
            inner = getattr(optimizer, "optimizer", optimizer)  # an AcceleratedOptimizer's own
            self.sync = DSSync(
                accelerator.unwrap_model(model),
                schedule=schedule,
                optimizer=inner,
                options=self.options,
            )
        self._no_sync: AbstractContextManager | None = None

    @property
    def steps(self) -> int:
        """Optimizer steps counted so far (``self.sync.averagings`` counts averagings)."""
        return self.sync.steps if self.sync is not None else 0

    def __enter__(self) -> DSSyncLocal:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._no_sync is None:
            return
        try:
            if exc[0] is None:  # after an error a peer may never come: leave at once
                self.sync.average_all()
        finally:
            self._no_sync.__exit__(*exc)
            self._no_sync = None

    def step(self) -> None:
        """Average with this step's group; skipped while gradients accumulate."""
        if self.sync is not None and self.accelerator.sync_gradients:
            self.sync.step()
