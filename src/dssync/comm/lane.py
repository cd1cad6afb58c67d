"""Group averages that start now and finish later, driven by a thread of their own.

A :class:`Lane` is made once, collectively, by every rank of a training group. It holds:

* its own process group over the same ranks and with the same backend (made at construction,
  never on the hot path), so that its traffic can never interleave with what the caller's thread
  sends on the training group meanwhile (a logging all_reduce, another strategy's collective);
* a :class:`~dssync.comm.averager.Router` on that group, so a lane average takes exactly the path
  and produces exactly the bits of a blocking one: the pair exchange with its chunk window, the
  k-1-buffer exchange of a larger group, a collective for the whole group;
* one worker thread that runs those averages one after another.

:meth:`Lane.start` hands the worker a group and flat buffers and returns a :class:`Pending` at
once; the worker copies the buffers and averages the copy, so the buffers given stay untouched,
and :meth:`Pending.wait` returns the means. Because the worker drives the exchange, the chunk
window keeps moving while the caller computes: an exchange posted from the caller's thread in one
go would instead send whole buffers both ways at once, which queues megabytes in a shaped link.

Order: only the worker issues operations on the lane's group, and a strategy starts at most one
average at a time (it waits for the previous one first), so every rank issues them in the same
order. Groups the training Router made for a repeating schedule may be lent to the lane
(``groups=``) when the caller never uses them while a lane average runs.

Bounds: every wait inside the worker is bounded by ``timeout_s`` and raises
:class:`~dssync.errors.PeerLost` or :class:`~dssync.errors.SyncError` as the blocking core does;
:meth:`Pending.wait` re-raises it in the caller's thread. A worker that has not answered
``timeout_s`` plus a grace period after the start raises ``PeerLost`` too.

Devices: on CUDA the worker waits for an event recorded on the caller's current stream after the
buffers were written, runs on the device's default stream, and records an event that the caller's
stream waits on before it reads the means (no host synchronization on either side).

Example::

    lane = Lane(None, timeout_s=60)                # every rank, at construction
    pending = lane.start([0, 1], OVERLAP, 7, snapshot)
    ...                                            # forward and backward of the next step
    means = pending.wait()                         # one tensor per buffer of ``snapshot``
    lane.close()
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from dssync.comm.averager import DEFAULT_TIMEOUT_S, Router
from dssync.comm.tags import Tag, layout_of
from dssync.errors import PeerLost

OVERLAP = 5  # the kind of an overlapped schedule step (a blocking step's tag is STEP)
GRACE_S = 30.0  # beyond timeout_s, the most a caller waits for a worker that never answers


class Pending:
    """One started group average; :meth:`wait` finishes it and returns the means."""

    def __init__(self, tag: Tag, group: list[int], timeout_s: float, future=None, means=None):
        self.tag = tag
        self.group = group
        self.timeout_s = timeout_s
        self._future = future
        self._means = means
        self._started = time.monotonic()

    def wait(self) -> list[torch.Tensor]:
        """The group means (one per buffer given to start); raises what the average raised."""
        if self._future is None:
            return self._means
        left = self.timeout_s + GRACE_S - (time.monotonic() - self._started)
        try:
            means, done = self._future.result(timeout=max(left, 0.001))
        except concurrent.futures.TimeoutError:
            raise PeerLost(
                f"{self.tag.describe()} in group {self.group}: the lane's worker gave no answer "
                f"within timeout_s={self.timeout_s:g} (+{GRACE_S:g} s)",
                step=self.tag.step,
                group=self.group,
            ) from None
        if done is not None:
            torch.cuda.current_stream(means[0].device).wait_event(done)
        return means


class Lane:
    """A process group and a worker thread for averages that run behind the caller's compute.

    Every rank of ``process_group`` (default: the world) makes it at the same point (it creates
    a process group). ``groups`` lends the lane collectives made elsewhere, keyed by the sorted
    ranks of ``process_group`` they span; see the module docstring for when that is safe.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        bucket_bytes: int | None = None,
        device: torch.device | None = None,
        groups: dict[tuple[int, ...], dist.ProcessGroup] | None = None,
    ) -> None:
        parent = process_group if process_group is not None else dist.group.WORLD
        ranks = dist.get_process_group_ranks(parent)
        self.group = dist.new_group(
            ranks,
            backend=dist.get_backend(parent),
            timeout=timedelta(seconds=timeout_s),
            use_local_synchronization=len(ranks) != dist.get_world_size(),
        )
        kwargs = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
        self.router = Router(self.group, None, timeout_s, device=device, **kwargs)
        if groups is not None:
            self.router.groups = groups  # shared: the lender's later groups are seen too
        self.timeout_s = float(timeout_s)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dssync-lane")

    def start(
        self, group: Sequence[int], kind: int, step: int, buffers: Sequence[torch.Tensor]
    ) -> Pending:
        """Start the average of ``buffers`` (flat, left untouched) with ``group``."""
        group = list(group)
        buffers = list(buffers)
        tag = Tag(kind, step, layout_of(buffers))
        if len(group) < 2:
            return Pending(tag, group, self.timeout_s, means=buffers)
        ready = None
        if buffers and buffers[0].is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(buffers[0].device))
        future = self._pool.submit(self._run, group, kind, step, buffers, ready)
        return Pending(tag, group, self.timeout_s, future=future)

    @torch.no_grad()
    def _run(self, group, kind, step, buffers, ready):
        done = None
        if ready is not None:
            device = buffers[0].device
            torch.cuda.set_device(device)
            stream = torch.cuda.current_stream(device)
            stream.wait_event(ready)
            for b in buffers:
                b.record_stream(stream)  # made on the caller's stream, read on this one
        means = [b.clone() for b in buffers]
        self.router.average(group, kind, step, buffers=means)
        if ready is not None:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(buffers[0].device))
        return means, done

    def close(self) -> None:
        """Stop the worker once the average it runs, if any, has finished."""
        self._pool.shutdown(wait=True)
