"""A test process-group backend, "nccl_like": gloo underneath, NCCL's rules on top, on a CPU.

dssync's users train on GPUs with NCCL; the development machines have neither. This backend runs
every operation on a wrapped ``ProcessGroupGloo`` and makes the caller live by the rules NCCL
imposes where gloo is more forgiving:

* **Waits ignore their timeout.** ``Work.wait(timeout)`` blocks until the operation is done (on
  NCCL it returns at once and the next host read blocks until the transfer ends, which is the
  same for the caller). Only ``Work.is_completed()`` tells without blocking, so a bounded wait
  must poll it against its own deadline (:mod:`dssync.comm.wait`).
* **Point-to-point tags are ignored.** Every message goes with tag 0 underneath, so messages
  between two ranks match by their posting order alone, as on NCCL.
* **The first operation of a group is a collective.** A send or receive before any collective
  on the group raises :class:`RuleBroken`.
* **Peers are counted.** :func:`peers` is the set of distinct ranks this process sent to or
  received from (global ranks, every nccl_like group together): each would be an NCCL
  connection with buffers of its own.
* **A watchdog ends the process.** An operation still pending at the group's timeout (as given to
  ``init_process_group``/``new_group``) prints a line naming it on stderr and ends the process
  with :data:`WATCHDOG_EXIT`, as NCCL's watchdog tears a process down. A group that was aborted
  (:meth:`NcclLikeGroup.abort`, ``ProcessGroup.abort()`` on NCCL) is left alone: its pending and
  later operations fail with :class:`Aborted` instead.
* **Errors.** When a peer's connection closes (the peer died), the operation fails; the error
  comes out of ``wait()``, and ``is_completed()`` is then True (on NCCL the work reports the
  remote error the same way, where the watchdog does not end the process first).

Operations complete in posting order per group (one thread waits for them one after another), as
kernels on one NCCL stream do.

Example (inside a worker started by :func:`dssync.lab.launch.spawn`)::

    from dssync.testing import nccl_like
    nccl_like.use_nccl_like_world(timeout_s=60)   # the default group is now nccl_like
    dist.isend(torch.ones(1), 1)                    # raises RuleBroken: no collective yet
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

NAME = "nccl_like"
WATCHDOG_EXIT = 134  # what a shell reports for SIGABRT, NCCL's watchdog's way out
WATCHDOG_PERIOD_S = 0.1
# gloo underneath waits longer than the group's timeout, so the watchdog, not gloo, ends a stall
INNER_SLACK_S = 60.0

_peers: set[int] = set()  # global ranks this process exchanged point-to-point messages with
_groups: weakref.WeakSet = weakref.WeakSet()
_watchdog: threading.Thread | None = None
_lock = threading.Lock()


class RuleBroken(RuntimeError):
    """An operation NCCL does not allow (a point-to-point one first, a gloo-only one)."""


class Aborted(RuntimeError):
    """An operation of a process group that was aborted."""


def peers() -> set[int]:
    """Distinct ranks (global) this process sent to or received from on nccl_like groups."""
    with _lock:
        return set(_peers)


def forget_peers() -> None:
    """Start counting peers afresh."""
    with _lock:
        _peers.clear()


class LikeWork(dist._Work):
    """One operation: done when the thread that waits for the group's operations in order says so."""

    def __init__(self, group: NcclLikeGroup, op: str, inner) -> None:
        super().__init__()
        self.group, self.op, self.inner = group, op, inner
        self.posted = time.monotonic()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def is_completed(self) -> bool:
        return self.done.is_set() or self.group.aborted

    def is_success(self) -> bool:
        return self.done.is_set() and self.error is None

    def exception(self):
        return self.error

    def wait(self, timeout: timedelta | None = None) -> bool:  # noqa: ARG002 - ignored, as NCCL's
        """Block until the operation is done, whatever ``timeout`` says; raise if it failed."""
        while not self.done.wait(0.05):
            if self.group.aborted:
                break
        if self.error is not None:
            raise self.error
        if not self.done.is_set():
            raise Aborted(f"{NAME}: {self.op} of an aborted process group")
        return True

    def __repr__(self) -> str:
        return f"LikeWork({self.op}, posted {time.monotonic() - self.posted:.1f} s ago)"


class NcclLikeGroup(dist.ProcessGroup):
    """A process group that runs on a wrapped ProcessGroupGloo under NCCL's rules (module doc)."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        global_ranks: list[int] | None = None,
    ) -> None:
        super().__init__(rank, size)
        self._name = ""
        self.timeout = timeout
        self.global_ranks = list(global_ranks) if global_ranks else list(range(size))
        inner_timeout = timeout + timedelta(seconds=INNER_SLACK_S)
        self.inner = dist.ProcessGroupGloo(store, rank, size, inner_timeout)
        self.aborted = False
        self.started = False  # a collective ran: point-to-point operations may follow
        self.pending: queue.SimpleQueue = queue.SimpleQueue()
        self.oldest: LikeWork | None = None  # the operation the completer waits for now
        self._completer = threading.Thread(target=self._complete, name=f"{NAME}-wait", daemon=True)
        self._completer.start()
        _groups.add(self)
        _start_watchdog()

    def getBackendName(self) -> str:  # noqa: N802 - the name torch calls
        return NAME

    def _set_group_name(self, name: str) -> None:  # a Python group keeps its own name
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def abort(self) -> None:
        """Give up on every pending operation (they fail with Aborted), as ncclCommAbort does."""
        self.aborted = True

    def _complete(self) -> None:
        while True:
            work = self.pending.get()
            if work is None:
                return
            self.oldest = work
            try:
                work.inner.wait()
            except BaseException as e:  # noqa: BLE001 - the caller's wait raises it
                work.error = e
            self.oldest = None
            work.done.set()

    def _post(self, op: str, run) -> LikeWork:
        if self.aborted:
            raise Aborted(
                f"{NAME}: {op} on an aborted process group; make a new group "
                "(an aborted NCCL communicator cannot be used again)"
            )
        work = LikeWork(self, op, run())
        self.pending.put(work)
        return work

    def _collective(self, op: str):
        def method(*args, **kwargs):
            work = self._post(op, lambda: getattr(self.inner, op)(*args, **kwargs))
            self.started = True
            return work

        return method

    def _p2p(self, op: str, tensors: list[torch.Tensor], peer: int, tag: int) -> LikeWork:
        if not self.started:
            raise RuleBroken(
                f"{NAME}: {op} to/from rank {peer} is the first operation on this process group; "
                "NCCL needs a collective first (every rank of the group, e.g. an all_reduce of "
                "one element) before point-to-point operations"
            )
        with _lock:
            _peers.add(self.global_ranks[peer])
        # tag 0 underneath: messages of a pair match by posting order only, as on NCCL
        return self._post(op, lambda: getattr(self.inner, op)(tensors, peer, 0))

    def send(self, tensors, dstRank, tag=0):  # noqa: N803 - torch's names
        return self._p2p("send", tensors, dstRank, tag)

    def recv(self, tensors, srcRank, tag=0):  # noqa: N803 - torch's names
        return self._p2p("recv", tensors, srcRank, tag)

    def recv_anysource(self, *args):
        raise RuleBroken(f"{NAME}: recv_anysource is gloo only; NCCL receives from a named rank")

    def monitored_barrier(self, *args):
        raise RuleBroken(f"{NAME}: monitored_barrier is gloo only; NCCL has none")

    def shutdown(self) -> None:
        self.pending.put(None)


for _op in (
    "allreduce",
    "allreduce_coalesced",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "alltoall",
    "alltoall_base",
    "gather",
    "scatter",
    "barrier",
):

    def _method(self, *args, _op=_op, **kwargs):
        return self._collective(_op)(*args, **kwargs)

    _method.__name__ = _op
    setattr(NcclLikeGroup, _op, _method)


def _watch() -> None:
    """End the process when an operation of a live group is pending past the group's timeout."""
    while True:
        time.sleep(WATCHDOG_PERIOD_S)
        for g in list(_groups):
            work = g.oldest
            if work is None or g.aborted or work.done.is_set():
                continue
            waited = time.monotonic() - work.posted
            if waited > g.timeout.total_seconds():
                sys.stderr.write(
                    f"[{NAME} watchdog] rank {dist.get_rank() if dist.is_initialized() else '?'}: "
                    f"{work.op} on process group {g.group_name!r} still pending after "
                    f"{waited:.1f} s, past the group's timeout of {g.timeout.total_seconds():g} s; "
                    "ending the process, as NCCL's watchdog does\n"
                )
                sys.stderr.flush()
                os._exit(WATCHDOG_EXIT)


def _start_watchdog() -> None:
    global _watchdog
    with _lock:
        if _watchdog is None or not _watchdog.is_alive():
            _watchdog = threading.Thread(target=_watch, name=f"{NAME}-watchdog", daemon=True)
            _watchdog.start()


def _create(opts, _backend_options) -> NcclLikeGroup:
    """The extended creator: told the group's name and global ranks."""
    pg = NcclLikeGroup(
        opts.store, opts.group_rank, opts.group_size, opts.timeout, opts.global_ranks_in_group
    )
    pg._set_group_name(opts.group_id)
    return pg


def register() -> None:
    """Make ``backend="nccl_like"`` known to torch.distributed in this process (idempotent)."""
    from dssync.comm.wait import POLLED

    POLLED.add(NAME)  # its waits ignore their timeout: dssync polls them, as nccl's
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])


def use_nccl_like_world(timeout_s: float = 60.0) -> None:
    """Replace the default (gloo) group of this worker by an nccl_like one over the same ranks.

    Every rank calls this. It reuses the store of the group :func:`dssync.lab.launch.spawn` made, so
    groups made later with the default backend (``dist.new_group(ranks)``) are nccl_like too.
    ``timeout_s`` is the group's timeout: the watchdog's.
    """
    from dssync.comm.side import forget_side_groups

    register()
    store = c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    forget_side_groups()
    dist.destroy_process_group()
    dist.init_process_group(
        NAME,
        store=dist.PrefixStore(NAME, store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
