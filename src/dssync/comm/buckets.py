"""Flat buckets: tensors laid out in a few contiguous buffers so one collective moves many tensors.

``FlatBuckets`` rebinds each tensor's storage to a view of its bucket, so averaging a bucket
averages the tensors in place with no copy in or out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


class FlatBuckets:
    """Tensors of the same device and dtype packed into buffers of at most ``bucket_bytes``.

    After construction each tensor's ``.data`` is a view into a bucket; :meth:`intact` tells
    whether that still holds (something like ``module.to()`` replaces the storage), and
    :meth:`average` all-reduces each bucket over a group and divides by its size.

    Example::

        params = [p for p in model.parameters()]
        buckets = FlatBuckets(params)
        buckets.average(group_pg, group_size=2)
    """

    def __init__(self, tensors: Sequence[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes={bucket_bytes} must be positive; the default is 25 MB")
        self.tensors = list(tensors)
        self.buffers: list[torch.Tensor] = []
        for members in plan_buckets(self.tensors, bucket_bytes):
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            offset = 0
            for t in members:
                n = t.numel()
                t.data = flat[offset : offset + n].view_as(t)
                offset += n
            self.buffers.append(flat)
        self._ptrs = [t.data_ptr() for t in self.tensors]

    @property
    def numel(self) -> int:
        return sum(b.numel() for b in self.buffers)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def intact(self) -> bool:
        """True while every tensor still lives in its bucket."""
        return all(t.data_ptr() == p for t, p in zip(self.tensors, self._ptrs, strict=True))

    def average(self, group: dist.ProcessGroup, group_size: int) -> None:
        """Average every bucket over ``group`` (all members call this). Async, then divide in order."""
        works = [dist.all_reduce(b, group=group, async_op=True) for b in self.buffers]
        for b, w in zip(self.buffers, works, strict=True):
            w.wait()
            b.div_(group_size)

    def broadcast(self, src: int, group: dist.ProcessGroup | None = None) -> None:
        """Overwrite every bucket with rank ``src``'s (a global rank)."""
        works = [dist.broadcast(b, src=src, group=group, async_op=True) for b in self.buffers]
        for w in works:
            w.wait()


def plan_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Group tensors by (device, dtype), then cut each kind into runs of at most ``bucket_bytes``.

    A tensor larger than ``bucket_bytes`` gets a bucket of its own.
    """
    kinds: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        kinds.setdefault((t.device, t.dtype), []).append(t)
    plan: list[list[torch.Tensor]] = []
    for members in kinds.values():
        current: list[torch.Tensor] = []
        size = 0
        for t in members:
            nbytes = t.numel() * t.element_size()
            if current and size + nbytes > bucket_bytes:
                plan.append(current)
                current, size = [], 0
            current.append(t)
            size += nbytes
        if current:
            plan.append(current)
    return plan


def average_tensors(tensors: Sequence[torch.Tensor], group: dist.ProcessGroup, group_size: int,
                    bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Average tensors that are not bucket views (e.g. optimizer state): copy in, reduce, copy out."""
    for chunk in plan_buckets(tensors, bucket_bytes):
        flat = torch.cat([t.detach().reshape(-1) for t in chunk])
        dist.all_reduce(flat, group=group)
        flat.div_(group_size)
        offset = 0
        for t in chunk:
            t.detach().copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
