"""At exit dssync waits until no collective's work holds a tensor it lent (no abort at exit).

A gloo worker thread that drops the last C++ reference to a tensor after the interpreter began
finalizing aborts the process; :func:`dssync.comm.inflight.drain` (run at exit) waits, bounded,
until every lent tensor is back to the use count it had. Here a work kept alive in Python stands
for a gloo thread that is late to let go of it.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from dssync.comm import inflight
from dssync.lab.launch import spawn


def _late_work() -> tuple[list[int], bool, float, list[int], bool]:
    t = torch.ones(8)
    inflight.lend([t])
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    held = [int(x.sum()) for x in inflight.held()]  # the work still holds it
    t0 = time.monotonic()
    first = inflight.drain(timeout_s=0.3)  # bounded: gives up while the work lives
    waited = time.monotonic() - t0
    inflight.lend([t])
    del work  # the holder lets go
    return held, first, waited, [int(x.sum()) for x in inflight.held()], inflight.drain(1.0)


@pytest.mark.timeout(120)
def test_drain_waits_for_works_that_hold_lent_tensors_and_is_bounded():
    [(held, first, waited, after, second)] = spawn(_late_work, 1, timeout_s=100)
    assert held == [8] and first is False and 0.25 < waited < 2.0
    assert after == [] and second is True


def _lane_closed_at_exit() -> bool:
    from dssync.comm.lane import Lane

    lane = Lane(None, timeout_s=20)
    inflight.drain(timeout_s=1.0)
    return lane._worker.is_alive()


@pytest.mark.timeout(120)
def test_drain_closes_lanes_first():
    assert spawn(_lane_closed_at_exit, 2, timeout_s=100) == [False, False]
