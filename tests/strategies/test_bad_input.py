"""Ranks that disagree are caught at construction; a lost worker fails the others, never hangs."""

from __future__ import annotations

import os
import time

import pytest
import torch.distributed as dist
from torch import nn

from dssync import DSSync, Shuffle
from dssync.lab.launch import WorkerError, spawn


def _mismatched_model():
    width = 5 if dist.get_rank() == 2 else 4
    DSSync(nn.Linear(width, 2), schedule=Shuffle(2, uneven=True))


def test_model_shape_mismatch_names_the_rank():
    with pytest.raises(WorkerError) as info:
        spawn(_mismatched_model, 3, timeout_s=120)
    assert info.value.exc_type == "UsageError"
    assert (
        "ranks [2] differ" in info.value.message
        and "same model on every rank" in info.value.message
    )


def _mismatched_schedule():
    seed = 1 if dist.get_rank() == 1 else 0
    DSSync(nn.Linear(4, 2), schedule=Shuffle(2, seed=seed, uneven=True))


def test_schedule_mismatch_names_the_rank_and_fix():
    with pytest.raises(WorkerError) as info:
        spawn(_mismatched_schedule, 3, timeout_s=120)
    assert "schedule: ranks [1] differ" in info.value.message
    assert "same schedule type, group size and seed" in info.value.message


def _too_large_group():
    DSSync(nn.Linear(4, 2), schedule=Shuffle(3))


def test_group_larger_than_world():
    with pytest.raises(WorkerError, match="group_size=3 is larger than world_size=2"):
        spawn(_too_large_group, 2, timeout_s=120)


def _dies():
    sync = DSSync(nn.Linear(64, 64), schedule=Shuffle(2, seed=0), timeout_s=5)
    for step in range(1000):
        if dist.get_rank() == 1 and step == 3:
            os._exit(17)  # a crash: no exception, no goodbye
        sync.step()
        time.sleep(0.01)


def test_a_dead_worker_stops_the_run_quickly():
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(_dies, 2, timeout_s=60, collective_timeout_s=5)
    assert time.monotonic() - t0 < 45
    assert info.value.rank == 1, info.value.detail  # the dead rank, not the survivor that noticed
    assert "exited with code 17" in info.value.detail
