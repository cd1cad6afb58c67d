"""The one bounded wait (comm/wait.py) without processes: works and groups are stand-ins.

A work that behaves like NCCL's (``wait(timeout)`` ignores the timeout) must still end by its
deadline, with its group aborted; one like gloo's keeps ``wait(timeout)``.
"""

from __future__ import annotations

import threading
import time

import pytest

from dssync.comm import wait as waits
from dssync.comm.wait import WaitFailed, wait_for


class _Group:
    """A process group that only records its abort (not a group torch knows: not gloo)."""

    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class _NcclLikeWork:
    """Done after ``after_s``; ``wait`` blocks until then whatever its timeout (NCCL's way)."""

    def __init__(self, after_s: float, error: Exception | None = None) -> None:
        self.done = threading.Event()
        self.error = error
        if after_s < 60:  # else never
            threading.Timer(after_s, self.done.set).start()

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self, timeout=None) -> bool:
        self.done.wait(120)
        if self.error is not None:
            raise self.error
        return True


def test_a_stuck_work_ends_at_its_deadline_and_its_group_is_aborted():
    group, work = _Group(), _NcclLikeWork(after_s=3600)  # never done
    t0 = time.monotonic()
    with pytest.raises(WaitFailed) as e:
        wait_for(work, t0 + 0.3, group)
    took = time.monotonic() - t0
    assert 0.3 <= took < 0.3 + 0.2, took  # polled to the deadline, not blocked in wait()
    assert e.value.expired and group.aborted
    assert abs(e.value.started - t0) < 0.05


def test_a_work_that_finishes_in_time_returns_promptly():
    group, work = _Group(), _NcclLikeWork(after_s=0.2)
    t0 = time.monotonic()
    wait_for(work, t0 + 5, group)
    assert time.monotonic() - t0 < 0.2 + 0.1  # seen within a nap of at most 1 ms (+ load)
    assert not group.aborted


def test_a_failed_work_raises_not_expired_and_aborts():
    group, work = _Group(), _NcclLikeWork(after_s=0.0, error=RuntimeError("connection closed"))
    with pytest.raises(WaitFailed) as e:
        wait_for(work, time.monotonic() + 5, group)
    assert not e.value.expired and group.aborted
    assert isinstance(e.value.__cause__, RuntimeError)


def test_a_bounded_backend_keeps_its_own_wait_with_the_time_left(monkeypatch):
    """On gloo, ``work.wait(timeout)``: no polling; a False return is a timeout too."""
    asked = []

    class GlooWork:
        def wait(self, timeout):
            asked.append(timeout.total_seconds())
            return False

        def is_completed(self):  # pragma: no cover - must not be polled
            raise AssertionError("a bounded backend's work is not polled")

    monkeypatch.setattr(waits, "bounded", lambda pg: True)  # as gloo
    with pytest.raises(WaitFailed) as e:
        wait_for(GlooWork(), time.monotonic() + 2, None)
    assert e.value.expired and 1.5 < asked[0] <= 2


def test_a_stuck_work_ends_when_another_member_says_it_failed():
    """A member waiting on a live one (a ring's neighbour) that failed on a third: told by the
    check, not at its deadline (10 s here)."""
    group, work = _Group(), _NcclLikeWork(after_s=3600)  # never done
    t0 = time.monotonic()
    with pytest.raises(WaitFailed) as e:
        wait_for(work, t0 + 10, group, others_failed=lambda: time.monotonic() - t0 > 1.0)
    took = time.monotonic() - t0
    assert 1.0 <= took < 1.0 + 3 * waits.ASK_EVERY_S + 0.3, took
    assert not e.value.expired and group.aborted
    assert "another member" in str(e.value)


def test_the_check_is_not_asked_in_a_short_wait_and_a_blocked_check_holds_nothing():
    asked = []
    group, work = _Group(), _NcclLikeWork(after_s=0.1)
    wait_for(work, time.monotonic() + 5, group, others_failed=lambda: asked.append(1) or True)
    assert asked == [] and not group.aborted  # done before ASK_AFTER_S: never asked
    stuck = threading.Event()
    group, work = _Group(), _NcclLikeWork(after_s=3600)
    t0 = time.monotonic()
    with pytest.raises(WaitFailed) as e:  # a store that never answers: the deadline holds
        wait_for(work, t0 + 1.5, group, others_failed=lambda: stuck.wait(60))
    assert e.value.expired and time.monotonic() - t0 < 1.5 + 0.3
    stuck.set()
