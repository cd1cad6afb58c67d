"""Flat buckets: tensors laid out in a few contiguous buffers so one collective moves many tensors.

``FlatBuckets`` rebinds each tensor's storage to a view of its bucket, so averaging a bucket
averages the tensors in place with no copy in or out. Each bucket keeps ``ROOM_BYTES`` spare after
its end (:func:`room_of`), where a pair exchange may carry its tag. Tensors that cannot be
re-laid (optimizer state, a torch averager's parameters) are copied in and out with :func:`pack`
and :func:`unpack`; both kinds of buffer then go through the same routine in
:mod:`dssync.comm.averager`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dssync.comm.tags import FIELDS, layout_of
from dssync.errors import UsageError

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
# Spare bytes kept after each bucket: a pair whose whole model is one message writes its tag
# there and sends it in the data's own message (:mod:`dssync.comm.exchange`), one message not two.
ROOM_BYTES = 8 * FIELDS  # an int64 tag (dssync.comm.tags)


class FlatBuckets:
    """Tensors of the same device and dtype packed into buffers of at most ``bucket_bytes``.

    After construction each tensor's ``.data`` is a view into a bucket; :meth:`intact` tells
    whether that still holds (something like ``module.to()`` replaces the storage). Averaging
    ``buckets.buffers`` in place (see :mod:`dssync.comm.averager`) averages the tensors.

    Example::

        params = [p for p in model.parameters()]
        buckets = FlatBuckets(params)
        buckets.buffers[0].mul_(0.5)    # halves every tensor in the first bucket
    """

    def __init__(
        self, tensors: Sequence[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> None:
        if bucket_bytes < 1:
            raise UsageError(f"bucket_bytes={bucket_bytes} must be positive; the default is 25 MB")
        self.tensors = list(tensors)
        self.buffers: list[torch.Tensor] = []
        for members in plan_buckets(self.tensors, bucket_bytes):
            flat = _roomy(sum(t.numel() for t in members), members[0])
            torch.cat([t.detach().reshape(-1) for t in members], out=flat)
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

    def layout(self) -> int:
        """Fingerprint of the buckets' sizes and dtypes (what a peer's buckets must match)."""
        return layout_of(self.buffers)


def _roomy(numel: int, like: torch.Tensor) -> torch.Tensor:
    """An empty flat buffer of ``numel`` elements with ``ROOM_BYTES`` of its own after its end."""
    spare = -(-ROOM_BYTES // like.element_size())
    whole = torch.empty(numel + spare, dtype=like.dtype, device=like.device)
    whole[numel:].zero_()  # no stale memory in a saved storage
    flat = whole[:numel]
    flat._dssync_room = whole  # only this object carries it: a slice of it has no room
    return flat


def room_of(b: torch.Tensor) -> torch.Tensor | None:
    """``b`` and the spare bytes after it, if ``b`` is a bucket made with them; else None."""
    whole = getattr(b, "_dssync_room", None)
    if whole is None or whole.data_ptr() != b.data_ptr() or whole.numel() <= b.numel():
        return None
    return whole


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


def pack(
    tensors: Sequence[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """Copy ``tensors`` into flat buffers (per device and dtype); pairs of (buffer, its tensors)."""
    return [
        (torch.cat([t.detach().reshape(-1) for t in chunk]), chunk)
        for chunk in plan_buckets(tensors, bucket_bytes)
    ]


def unpack(flats: Sequence[tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
    """Copy each flat buffer back into its tensors (the inverse of :func:`pack`)."""
    for flat, chunk in flats:
        offset = 0
        for t in chunk:
            t.detach().copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
