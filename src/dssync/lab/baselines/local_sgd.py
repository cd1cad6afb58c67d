"""Local SGD: every rank trains alone and all ranks average their parameters every ``every`` steps."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm import DEFAULT_BUCKET_BYTES, FlatBuckets
from dssync.comm.align import align_rest
from dssync.comm.averager import Router
from dssync.comm.exchange import broadcast_tensors
from dssync.comm.tags import ALL
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError
from dssync.lab.baselines.protocol import LabStrategy


class LocalSGD(LabStrategy):
    """Global parameter averaging every ``every`` steps (every=1 is plain model averaging).

    The averaging goes through the same core as DS-Sync (:class:`dssync.comm.averager.Router`).

    Example::

        strategy = LocalSGD(model, every=4)
        ...
        optimizer.step(); strategy.step()
    """

    name = "local-sgd"

    def __init__(
        self,
        module: nn.Module,
        every: int = 4,
        process_group: dist.ProcessGroup | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(module, process_group)
        if every < 1:
            raise UsageError(f"every={every} must be >= 1 (steps between global averages)")
        self.every = every
        self.steps = 0
        self.world_size = dist.get_world_size(process_group)
        tensors = [p for p in module.parameters() if p.requires_grad]
        tensors += [b for b in module.buffers() if b.is_floating_point()]
        self._buckets = FlatBuckets(tensors, bucket_bytes)
        self.router = Router(process_group, None, timeout_s, bucket_bytes)
        with torch.no_grad():
            broadcast_tensors(
                list(module.parameters()) + list(module.buffers()),
                0,
                process_group,
                timeout_s,
                self.router.roll,
            )

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        if self.steps % self.every == 0:
            self.average_all()

    @torch.no_grad()
    def average_all(self) -> None:
        with self.syncing():
            self.router.average(
                range(self.world_size), ALL, self.steps, buffers=self._buckets.buffers
            )
            align_rest(
                self.module, self._buckets.tensors, self.process_group, self.router.timeout_s
            )

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])


class Solo(LocalSGD):
    """No averaging while training: each rank trains on its own shard from the same start, and
    :meth:`average_all` makes one global average at the end (one-shot averaging).

    The control of a time-to-train table: a target this reaches does not need synchronization,
    so the table measures iteration speed, not how well a method synchronizes.
    """

    name = "solo"

    def __init__(
        self,
        module: nn.Module,
        process_group: dist.ProcessGroup | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(module, 1, process_group, bucket_bytes, timeout_s)

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
