"""BSP: PyTorch's own DistributedDataParallel, gradients all-reduced every step.

Data and metadata: DDP moves only gradients (and, at start-up, its own shape check and the initial
parameters) through the training group, on the parameters' device; dssync adds nothing to it.

Sync time (the ``sync`` column): the time during which at least one of DDP's bucket all-reduces
was in flight, from the moment a bucket's gradients were ready (the communication hook ran) until
its all-reduce finished, merged over the buckets of the step. DDP starts a bucket's all-reduce while
backward is still computing the gradients of earlier layers, so this time overlaps backward: BSP's
iteration time is not compute + sync, and its sync column is not comparable term for term with
DS-Sync's, which never overlaps compute. On the CPU the spans are read from the host clock; on a
GPU from CUDA events recorded on the stream, so they cover the device's work, not the launch.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dssync.comm.align import align_rest
from dssync.lab.baselines.protocol import LabStrategy


class BSP(LabStrategy):
    """Bulk-synchronous data parallelism through ``torch.nn.parallel.DistributedDataParallel``.

    Sync time is the union of the spans during which DDP's bucket all-reduces were in flight
    (recorded by a communication hook that wraps DDP's default all-reduce); it overlaps backward.

    Example::

        strategy = BSP(model)
        loss = loss_fn(strategy.model(x), y)   # forward through the DDP wrapper
        loss.backward()                        # gradients all-reduced during backward
        optimizer.step()
        strategy.take_sync_time()              # seconds with an all-reduce in flight
    """

    name = "bsp"
    # every rank applies the same all-reduced gradient (tests/strategies/test_baselines.py
    # checks fp16 and PowerSGD, tests/strategies/test_bsp.py plain DDP)
    replicas_equal = True

    def __init__(
        self,
        module: nn.Module,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float = 25.0,
        **ddp_kwargs,
    ) -> None:
        super().__init__(module, process_group)
        self.ddp = DistributedDataParallel(
            module, process_group=process_group, bucket_cap_mb=bucket_cap_mb, **ddp_kwargs
        )
        self._spans: list[tuple[object, object]] = []  # (start, end) marks of each bucket
        self.ddp.register_comm_hook(None, self._timed_allreduce)

    @property
    def model(self) -> nn.Module:
        return self.ddp

    def _timed_allreduce(self, _state, bucket):  # no return annotation: DDP checks it literally
        device = bucket.buffer().device
        start = _mark(device)
        fut = self._communicate(bucket)

        def done(f: torch.futures.Future) -> torch.Tensor:
            # on a GPU this runs with streams that wait for the all-reduce, so the end event
            # completes after it; list.append is atomic, as callbacks may run on another thread
            self._spans.append((start, _mark(device)))
            return f.value()

        return fut.then(done)

    def _communicate(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """Start averaging one bucket's gradients; a future of the averaged bucket.

        A subclass swaps in another DDP communication hook here (compression: see
        ``strategies/compressed.py``) and keeps this class's timing.
        """
        pg = self.process_group or dist.group.WORLD
        tensor = bucket.buffer().div_(dist.get_world_size(pg))
        fut = dist.all_reduce(tensor, group=pg, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    def take_sync_time(self) -> float:
        """Seconds during which at least one all-reduce was in flight, since the last call."""
        spans, self._spans = self._spans, []
        return super().take_sync_time() + covered(_seconds(spans))

    def average_all(self) -> None:
        """DDP keeps the parameters identical; buffers follow rank 0 (as DDP's broadcast does)."""
        align_rest(self.module, self.module.parameters(), self.process_group)


def _mark(device: torch.device) -> object:
    """A point in time: a CUDA event recorded on the current stream, else the host clock."""
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _seconds(spans: list[tuple[object, object]]) -> list[tuple[float, float]]:
    """Spans as seconds on one axis (CUDA events: relative to the first start, once finished)."""
    if not spans or isinstance(spans[0][0], float):
        return spans  # type: ignore[return-value]
    origin = spans[0][0]
    for _, end in spans:
        end.synchronize()
    return [(origin.elapsed_time(s) / 1e3, origin.elapsed_time(e) / 1e3) for s, e in spans]


def covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end]`` spans (time with at least one span open).

    Example::

        >>> covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])
        4.0
    """
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
