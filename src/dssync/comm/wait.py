"""One bounded wait for every operation dssync starts: it returns, or it raises by the deadline.

``Work.wait(timeout)`` means different things on different backends. On gloo it returns when the
operation is done or raises at the timeout. On NCCL (without ``TORCH_NCCL_BLOCKING_WAIT``) it only
makes the current CUDA stream wait and returns at once, ignoring the timeout: the next host read
then blocks until the transfer ends, or until NCCL's watchdog ends the process at the group's
timeout (10 minutes by default), naming no one. :func:`wait_for` bounds both:

* on gloo (any backend not in :data:`POLLED`) it calls ``work.wait(timeout)`` with what is left
  of the deadline, as before (no polling: nothing slower on gloo);
* on a backend in :data:`POLLED` (nccl, the ``nccl_like`` test backend) it polls
  ``work.is_completed()``, sleeping between polls from :data:`FIRST_NAP_S` up to
  :data:`LONGEST_NAP_S`, then calls ``work.wait()`` (which on NCCL orders the current stream
  after the work, and raises the work's error). When the deadline passes first it aborts the
  process group (``ProcessGroup.abort()``: an NCCL communicator with a stuck operation cannot be
  used again, and aborting frees it and stops the watchdog from ending the process) and raises.
  Given ``others_failed`` (a check a caller supplies, e.g. "did a member of this group already
  fail it?"), a polled wait that lasted :data:`ASK_AFTER_S` asks it every :data:`ASK_EVERY_S`
  from a thread of its own (a store that does not answer cannot hold the wait), and on a yes
  aborts and raises as for a failed operation: a member waiting on a live member in a ring
  learns that another one failed, instead of waiting to its deadline.

It raises :class:`WaitFailed` saying whether the deadline passed (``expired``) or the operation
failed, and when the wait began; callers turn it into :class:`~dssync.errors.PeerLost` naming the
peer (:func:`dssync.comm.exchange.wait`). A rank ends its wait at most about
:data:`LONGEST_NAP_S` after its deadline; what callers add after it (a roll call that finds who
never came) they state themselves.

Example::

    work = dist.all_reduce(t, group=pg, async_op=True)
    wait_for(work, time.monotonic() + 60, pg)   # returns, or raises WaitFailed within ~60 s
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

# Backends whose Work.wait(timeout) ignores its timeout: their waits poll is_completed(). Any
# other (gloo, and wrappers of it such as the tests' strict backend, whose point-to-point works
# report completion only from wait()) keeps work.wait(timeout). A test backend with NCCL's
# semantics adds its name here (dssync.testing.nccl_like does).
POLLED: set[str] = {"nccl"}
# The longest any wait for a peer lasts unless told otherwise: the one default of every
# timeout_s in dssync (DSSync, AsyncDSSync, GroupAverager, the lab's runs).
DEFAULT_TIMEOUT_S = 120.0
FIRST_NAP_S = 50e-6  # the first sleep between two polls of is_completed()
LONGEST_NAP_S = 1e-3  # sleeps double up to this: a finished transfer is seen within 1 ms
ASK_AFTER_S = 0.5  # a polled wait this long starts asking whether another member failed
ASK_EVERY_S = 0.1  # and asks again this often


class WaitFailed(RuntimeError):
    """A bounded wait that did not see its operation succeed.

    ``expired``: the deadline passed first (else the operation failed: a connection closed).
    ``started``: when the wait began (``time.monotonic()``).
    """

    def __init__(self, message: str, expired: bool, started: float) -> None:
        super().__init__(message)
        self.expired = expired
        self.started = started


_bounded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # group -> bounded(group)


def bounded(process_group: dist.ProcessGroup | None) -> bool:
    """True when ``process_group``'s ``Work.wait(timeout)`` honours its timeout (not in
    :data:`POLLED`)."""
    pg = process_group if process_group is not None else dist.group.WORLD
    known = _bounded.get(pg)
    if known is None:
        try:
            known = _bounded[pg] = dist.get_backend(pg) not in POLLED
        except (RuntimeError, ValueError):  # destroyed, or not a group of this process
            return False  # polling is safe for any work that reports is_completed()
    return known


def abort(process_group: dist.ProcessGroup | None) -> None:
    """Abort ``process_group``'s communicator (its pending operations fail; it is unusable)."""
    pg = process_group if process_group is not None else dist.group.WORLD
    try:
        pg.abort()
    except (RuntimeError, AttributeError, NotImplementedError):  # nothing to abort, or gone
        pass


def wait_for(
    work,
    deadline: float,
    process_group: dist.ProcessGroup | None = None,
    others_failed: Callable[[], bool] | None = None,
) -> None:
    """Return when ``work`` succeeded; raise :class:`WaitFailed` when it failed or ``deadline``
    (``time.monotonic()`` seconds) passed first. ``process_group`` is the group ``work`` runs on
    (None: the default group): it says how to wait, and it is what an expiry aborts.
    ``others_failed``: asked during a long polled wait (see the module's text); gloo's waits
    block and do not ask it."""
    started = time.monotonic()
    if bounded(process_group):
        try:
            done = work.wait(timeout=timedelta(seconds=max(deadline - started, 0.001)))
        except (dist.DistError, RuntimeError) as e:
            raise WaitFailed(str(e), time.monotonic() >= deadline - 0.05, started) from e
        if done is False:  # a wait that reports its timeout instead of raising
            raise WaitFailed("the wait returned False (timed out)", True, started)
        return
    nap = FIRST_NAP_S
    asker: _Asker | None = None
    try:
        while not work.is_completed():
            now = time.monotonic()
            if now >= deadline:
                abort(process_group)
                raise WaitFailed(
                    "not completed by the deadline; the process group was aborted", True, started
                )
            if others_failed is not None and asker is None and now - started >= ASK_AFTER_S:
                asker = _Asker(others_failed)
            if asker is not None and asker.said.is_set():
                abort(process_group)
                raise WaitFailed(
                    "another member of the group failed this operation; the process group was "
                    "aborted",
                    False,
                    started,
                )
            time.sleep(nap)
            nap = min(nap * 2, LONGEST_NAP_S)
    finally:
        if asker is not None:
            asker.done.set()
    try:
        work.wait()
    except (dist.DistError, RuntimeError) as e:
        abort(process_group)
        raise WaitFailed(str(e), False, started) from e


class _Asker:
    """Asks ``others_failed`` every :data:`ASK_EVERY_S` in a daemon thread until :attr:`done`;
    :attr:`said` is set on the first yes. A check that blocks (a stopped store) blocks only it."""

    def __init__(self, others_failed: Callable[[], bool]) -> None:
        self.said, self.done = threading.Event(), threading.Event()

        def ask() -> None:
            while not self.done.is_set():
                try:
                    if others_failed():
                        self.said.set()
                        return
                except Exception:  # noqa: BLE001 - a check that cannot answer says nothing
                    return
                self.done.wait(ASK_EVERY_S)

        threading.Thread(target=ask, name="dssync-wait-asker", daemon=True).start()
