"""Local SGD: every rank trains alone and all ranks average their parameters every ``period`` steps."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm import DEFAULT_BUCKET_BYTES, FlatBuckets
from dssync.strategies.base import Strategy, SyncTimer


class LocalSGD(Strategy):
    """Global parameter averaging every ``period`` steps (period 1 is plain model averaging).

    Example::

        strategy = LocalSGD(model, period=4)
        ...
        optimizer.step(); strategy.after_step()
    """

    name = "local-sgd"

    def __init__(self, module: nn.Module, period: int = 4, process_group: dist.ProcessGroup | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        super().__init__(module, process_group)
        if period < 1:
            raise ValueError(f"period={period} must be >= 1 (steps between global averages)")
        self.period = period
        self.steps = 0
        self.world_size = dist.get_world_size(process_group)
        tensors = list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]
        self._buckets = FlatBuckets(tensors, bucket_bytes)
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        with torch.no_grad():
            self._buckets.broadcast(src, group=process_group)

    @torch.no_grad()
    def after_step(self) -> None:
        self.steps += 1
        if self.steps % self.period == 0:
            self.average_all()

    @torch.no_grad()
    def average_all(self) -> None:
        with SyncTimer(self):
            self._buckets.average(self.process_group, self.world_size)

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
