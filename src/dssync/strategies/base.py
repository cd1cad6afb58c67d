"""The strategy interface: what a training script calls after the optimizer step.

Every synchronization method of the library (DS-Sync, waitless pairs) is one small class behind
this interface, so a training loop is written once::

    strategy = DSSync(model)                  # or AsyncDSSync(model), ...
    for batch in loader:
        loss = loss_fn(strategy.model, batch)
        loss.backward()
        optimizer.step()
        strategy.step()
        optimizer.zero_grad()
    strategy.average_all()                    # one global average for the final model

The lab's loop adds its own protocol on top (a call after backward, timings, the baselines):
:mod:`dssync.lab.baselines.protocol`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch.distributed as dist
from torch import nn


class Strategy:
    """Base class: no synchronization at all (each rank trains alone).

    ``model`` is what forward runs on (a wrapper such as DDP for a baseline, else the module
    itself); ``module`` is the plain module whose parameters are trained. Each synchronization
    runs inside :meth:`syncing`; an observer set as :attr:`on_sync` (a factory
    ``strategy -> context manager``, such as the lab's timer) wraps every one, none by default.
    """

    name = "none"

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None) -> None:
        self.module = module
        self.process_group = process_group
        self.on_sync: Callable[[Strategy], AbstractContextManager[Any]] | None = None

    @property
    def model(self) -> nn.Module:
        return self.module

    def syncing(self) -> AbstractContextManager[Any]:
        """The context one synchronization runs in: :attr:`on_sync`'s, or nothing."""
        return nullcontext() if self.on_sync is None else self.on_sync(self)

    def step(self) -> None:
        """Called after ``optimizer.step()``: the one call every strategy takes there."""

    def after_step(self) -> None:
        """The older name of :meth:`step`."""
        self.step()

    def average_all(self) -> None:
        """Leave every rank with the same model (the global average)."""

    def close(self) -> None:
        """Release what the strategy holds beyond the model (background threads, the process
        groups it made), after its last step and ``average_all()``; every rank calls it alike.
        It takes no more steps after. A process that runs several trainings one after another
        calls it between them."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
