"""The strategy interface: what runs after backward and after the optimizer step.

Every synchronization method (DS-Sync, BSP, local SGD, hierarchical all-reduce) is one small
class behind this interface, so a training loop is written once:

    strategy = DSSync(model)                  # or BSP(model), ...
    for batch in loader:
        loss = loss_fn(strategy.model, batch)
        loss.backward()
        strategy.after_backward()
        optimizer.step()
        strategy.step()
        optimizer.zero_grad()
    strategy.average_all()                    # one global average for the final model
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from dssync.comm.clock import clock, module_device


class Strategy:
    """Base class: no synchronization at all (each rank trains alone).

    ``model`` is what forward runs on (a wrapper such as DDP for BSP, else the module itself);
    ``module`` is the plain module whose parameters are trained. :meth:`take_sync_time` returns the
    seconds spent synchronizing since it was last called, once :meth:`time_sync` turned timing
    on (a lab's training loop does; the library does not time itself by default).
    """

    name = "none"
    # True where every rank's parameters are bitwise equal after every step (DDP and its
    # hooks), so an evaluation need not average them first.
    replicas_equal = False

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None) -> None:
        self.module = module
        self.process_group = process_group
        self._sync_s = 0.0
        self.timing = False

    @property
    def model(self) -> nn.Module:
        return self.module

    def after_backward(self) -> None:
        """Called after ``loss.backward()``, before the optimizer step."""

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
        calls it between them (:func:`dssync.lab.train.run.train_series`)."""

    def time_sync(self, on: bool = True) -> None:
        """Time each synchronization from now on (:meth:`take_sync_time`). An observer for a
        lab's loop: on a GPU every timed synchronization waits for the device at both ends
        (:class:`SyncTimer`), so the CPU can no longer run ahead of it; off by default."""
        self.timing = on

    def take_sync_time(self) -> float:
        """Seconds spent synchronizing since the last call (0 unless :meth:`time_sync` is on)."""
        t, self._sync_s = self._sync_s, 0.0
        return t

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class SyncTimer:
    """Context manager that adds its elapsed time to a strategy's sync time, when the strategy's
    timing is on (:meth:`Strategy.time_sync`); otherwise it does nothing.

    On a GPU it waits for the device at both ends, so the time is that of the work itself, not of
    queueing it (:func:`dssync.comm.clock.clock`): a cost only a run that asked for timings pays.
    """

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.on = getattr(strategy, "timing", False)
        self.device = module_device(strategy.module) if self.on else None

    def __enter__(self) -> SyncTimer:
        self.t0 = clock(self.device) if self.on else 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on:
            self.strategy._sync_s += clock(self.device) - self.t0
