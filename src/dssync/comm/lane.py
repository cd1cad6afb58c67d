"""Group averages that start now and finish later, driven by a thread of their own.

A :class:`Lane` is made once, collectively, by every rank of a training group. It holds:

* its own process group over the same ranks and with the same backend (made at construction,
  never on the hot path), so that its traffic can never interleave with what the caller's thread
  sends on the training group meanwhile (a logging all_reduce, another strategy's collective);
* a :class:`~dssync.comm.averager.Router` on that group, so a lane average takes exactly the path
  and produces exactly the bits of a blocking one, through the one transport
  (:class:`~dssync.comm.transport.Transport`: a pair's chunk window on gloo, the shares of a
  larger group, a collective for the whole group);
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

Devices: on CUDA the worker runs on a stream of its own. It waits for an event recorded on the
caller's current stream after the buffers were written, and records one that the caller's stream
waits on before it reads the means; the tensors that cross streams are marked for the caching
allocator (``record_stream``). The tag checks synchronize the worker with its own stream only,
so the caller's thread and its kernels never wait on the lane. Untested on GPUs here (no GPU).
Two cautions on nccl: the lane is a second communicator driven by a second thread, and NCCL
asks that operations on several communicators be ordered alike on every rank (the caller's own
collectives while an average runs are not); and a lane over a subgroup is made with local
synchronization, which torch's eager nccl initialization (``device_id=``) does not support.

Example::

    lane = Lane(None, timeout_s=60)                # every rank, at construction
    pending = lane.start([0, 1], OVERLAP, 7, snapshot)
    ...                                            # forward and backward of the next step
    means = pending.wait()                         # one tensor per buffer of ``snapshot``
    lane.close()
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from dssync.comm.averager import Router
from dssync.comm.inflight import close_at_exit
from dssync.comm.tags import Tag, layout_of
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import PeerLost, UsageError
from dssync.schedules.base import WHOLE, Part

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
        concurrent.futures.wait([self._future], timeout=max(left, 0.001))
        if not self._future.done():
            raise PeerLost(
                f"{self.tag.describe()} in group {self.group}: the lane's worker gave no answer "
                f"within timeout_s={self.timeout_s:g} (+{GRACE_S:g} s)",
                step=self.tag.index,
                group=self.group,
            )
        means, done = self._future.result()  # raises what the worker raised
        if done is not None:
            caller = torch.cuda.current_stream(means[0].device)
            caller.wait_event(done)
            for m in means:
                m.record_stream(caller)  # made on the lane's stream, read and freed on this one
        return means


class Lane:
    """A process group and a worker thread for averages that run behind the caller's compute.

    Every rank of ``process_group`` (default: the world) makes it at the same point (it creates
    a process group). ``groups`` lends the lane collectives made elsewhere, keyed by the sorted
    ranks of ``process_group`` they span; see the module docstring for when that is safe.
    :meth:`close` stops the worker; a lane never closed is closed at exit, before the
    interpreter finalizes (:mod:`dssync.comm.inflight`); its worker is a daemon thread, so a
    worker stuck in a wait holds the process at most ``timeout_s`` plus a grace period.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        bucket_bytes: int | None = None,
        device: torch.device | None = None,
        groups: dict[tuple[int, ...], dist.ProcessGroup] | None = None,
        wire: str = "fp32",
        nonfinite: str = "raise",
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
        self.router = Router(
            self.group, None, timeout_s, device=device, wire=wire, nonfinite=nonfinite, **kwargs
        )
        if groups is not None:
            self.router.groups = groups  # shared: the lender's later groups are seen too
        self.timeout_s = float(timeout_s)
        cuda = device is not None and device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if cuda else None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._serve, name="dssync-lane", daemon=True)
        self._worker.start()
        close_at_exit(self)  # a worker mid-average when the interpreter finalizes would abort it

    def start(
        self,
        group: Sequence[int],
        kind: int,
        step: int,
        buffers: Sequence[torch.Tensor],
        part: Part = WHOLE,
        ranged: int = 0,
    ) -> Pending:
        """Start the average of ``buffers`` (flat, left untouched) with ``group``; with ``part``,
        of that slice only (the rest of the means are the buffers as given). The last ``ranged``
        buffers keep their range on a compressed wire (``Router.average``'s ``ranged=``)."""
        group = list(group)
        buffers = list(buffers)
        tag = Tag(kind, step, layout_of(buffers))
        if len(group) < 2:
            return Pending(tag, group, self.timeout_s, means=[b.clone() for b in buffers])
        if not self._worker.is_alive():
            raise UsageError("this lane was closed; make a new one (every rank alike)")
        ready = None
        if self._stream is not None:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(buffers[0].device))
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, group, kind, step, buffers, ready, part, ranged))
        return Pending(tag, group, self.timeout_s, future=future)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, *args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._run(*args))
            except BaseException as e:  # handed to the caller's wait, which re-raises it
                future.set_exception(e)

    @torch.no_grad()
    def _run(self, group, kind, step, buffers, ready, part, ranged=0):
        if self._stream is None:
            means = [b.clone() for b in buffers]
            self._average(group, kind, step, means, part, ranged)
            return means, None
        with torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            self._stream.wait_event(ready)  # the caller's writes of the snapshot come first
            for b in buffers:
                b.record_stream(self._stream)  # made on the caller's stream, read on this one
            means = [b.clone() for b in buffers]
            self._average(group, kind, step, means, part, ranged)
            done = torch.cuda.Event()
            done.record(self._stream)
        return means, done

    def _average(self, group, kind, step, means, part, ranged):
        cut = len(means) - ranged
        kept = means[cut:]
        self.router.average(group, kind, step, buffers=means[:cut], part=part, ranged=kept)

    def close(self) -> None:
        """Stop the worker once the average it runs, if any, has finished (bounded)."""
        if self._worker.is_alive():
            self._jobs.put(None)
            self._worker.join(timeout=self.timeout_s + GRACE_S)
