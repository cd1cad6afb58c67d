"""Timings only when asked: the library does not wait for the device to time itself."""

from __future__ import annotations

import torch

import dssync.strategies.base as base
from dssync.strategies.base import Strategy, SyncTimer


def test_sync_timer_reads_no_clock_until_timing_is_turned_on(monkeypatch):
    reads = []
    monkeypatch.setattr(base, "clock", lambda device=None: reads.append(device) or 1.0)
    strategy = Strategy(torch.nn.Linear(2, 2))
    with SyncTimer(strategy):  # by default: no clock, so no device synchronize on a GPU
        pass
    assert reads == [] and strategy.take_sync_time() == 0.0
    strategy.time_sync()  # the lab's loop turns it on
    with SyncTimer(strategy):
        pass
    assert len(reads) == 2 and reads[0] == torch.device("cpu")
