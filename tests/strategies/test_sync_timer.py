"""Timings only when asked: the library does not wait for the device to time itself; the lab's
timer is an observer it sets on a strategy."""

from __future__ import annotations

import torch

import dssync.lab.baselines.protocol as protocol
from dssync.lab.baselines.protocol import SyncTimer, take_sync_time, time_sync
from dssync.strategies.base import Strategy


def test_a_strategy_reads_no_clock_until_the_lab_times_it(monkeypatch):
    reads = []
    monkeypatch.setattr(protocol, "clock", lambda device=None: reads.append(device) or 1.0)
    strategy = Strategy(torch.nn.Linear(2, 2))
    with strategy.syncing():  # by default: no clock, so no device synchronize on a GPU
        pass
    assert reads == [] and take_sync_time(strategy) == 0.0
    time_sync(strategy)  # the lab's loop turns it on
    assert strategy.on_sync is SyncTimer
    with strategy.syncing():
        pass
    assert len(reads) == 2 and reads[0] == torch.device("cpu")
    time_sync(strategy, on=False)
    with strategy.syncing():
        pass
    assert len(reads) == 2


def test_the_library_keeps_no_lab_protocol():
    for name in ("after_backward", "time_sync", "take_sync_time", "replicas_equal"):
        assert not hasattr(Strategy, name), name
