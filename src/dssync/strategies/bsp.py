"""BSP: PyTorch's own DistributedDataParallel, gradients all-reduced every step."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dssync.strategies.base import Strategy


class BSP(Strategy):
    """Bulk-synchronous data parallelism through ``torch.nn.parallel.DistributedDataParallel``.

    Sync time is the wall time during which at least one of DDP's bucket all-reduces was in flight
    (recorded by a communication hook that wraps DDP's default all-reduce); it overlaps backward.

    Example::

        strategy = BSP(model)
        loss = loss_fn(strategy.model(x), y)   # forward through the DDP wrapper
    """

    name = "bsp"

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None,
                 bucket_cap_mb: float = 25.0, **ddp_kwargs) -> None:
        super().__init__(module, process_group)
        self.ddp = DistributedDataParallel(module, process_group=process_group,
                                           bucket_cap_mb=bucket_cap_mb, **ddp_kwargs)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._since = 0.0
        self.ddp.register_comm_hook(None, self._timed_allreduce)

    @property
    def model(self) -> nn.Module:
        return self.ddp

    def _timed_allreduce(self, _state, bucket):  # no return annotation: DDP checks it literally
        pg = self.process_group or dist.group.WORLD
        n = dist.get_world_size(pg)
        self._begin()
        tensor = bucket.buffer().div_(n)
        fut = dist.all_reduce(tensor, group=pg, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            self._end()
            return f.value()[0]

        return fut.then(done)

    def _begin(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1

    def _end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._sync_s += time.perf_counter() - self._since

    def average_all(self) -> None:
        """Nothing to do: DDP keeps every rank's parameters identical."""
