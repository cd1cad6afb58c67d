"""How much one slow worker delays the others, under DS-Sync and under DDP.

Each method trains the same workload twice on local workers: once as is, once with rank
``slow_rank`` sleeping ``slow_ms`` in every step. The figure is the other workers' mean
iteration time with the straggler over their time without it. Under DDP every step waits for
the straggler; under DS-Sync only its group does, though through shuffled groups the delay
reaches everyone within a few steps (a rank can only run ahead of its next partner).

Example::

    rows = straggler_bench(StragglerSettings(workers=4, slow_ms=20, steps=60))
    rows[0]["slowdown"]     # e.g. 1.4 for dssync
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError
from dssync.lab.methods import for_method, get_method
from dssync.lab.train import TrainConfig, run_training
from dssync.lab.train.hooks import StepHook

DEFAULT_METHODS = ("dssync", "dssync-async", "dssync-static", "bsp")


class Straggler(StepHook):
    """Rank ``rank`` sleeps ``ms`` after its backward pass, before it synchronizes."""

    def __init__(self, rank: int, ms: float) -> None:
        self.rank, self.ms = rank, ms

    def before_sync(self, rank: int, step: int) -> None:
        if rank == self.rank and self.ms > 0:
            time.sleep(self.ms / 1000)


@dataclass
class StragglerSettings:
    """What to run: workload, local workers, the straggler and how many steps."""

    workload: str = "digits"
    workers: int = 4
    group_size: int = 2
    slow_rank: int = 0
    slow_ms: float = 20.0
    steps: int = 60
    seed: int = 0
    methods: tuple[str, ...] = ("dssync", "bsp")  # names from dssync.lab.methods
    timeout_s: float = DEFAULT_TIMEOUT_S


def straggler_bench(s: StragglerSettings) -> list[dict[str, Any]]:
    """One row per method: the others' iteration time without and with the straggler, and the ratio."""
    for m in s.methods:
        get_method(m)
    if not 0 <= s.slow_rank < s.workers:
        raise UsageError(
            f"--slow-rank {s.slow_rank} does not exist with {s.workers} workers; use 0 to {s.workers - 1}"
        )
    base = TrainConfig(
        workload=s.workload,
        group_size=s.group_size,
        epochs=10**6,
        max_steps=s.steps,
        eval_every=10**9,
        seed=s.seed,
        timeout_s=s.timeout_s,
        progress=False,
    )
    rows = []
    for m in s.methods:
        times = {}
        for label, ms in (("plain", 0.0), ("straggler", s.slow_ms)):
            cfg = for_method(base, m)
            summary = run_training(cfg, workers=s.workers, hook=Straggler(s.slow_rank, ms))
            times[label] = summary["rank_iter_time_s"]
        others = [r for r in range(s.workers) if r != s.slow_rank]
        plain = float(np.mean([times["plain"][r] for r in others]))
        slow = float(np.mean([times["straggler"][r] for r in others]))
        rows.append(
            {
                "method": m,
                "workers": s.workers,
                "slow_rank": s.slow_rank,
                "slow_ms": s.slow_ms,
                "steps": s.steps,
                "others_iter_s": plain,
                "others_iter_straggler_s": slow,
                "slowdown": slow / plain,
                "added_ms": (slow - plain) * 1000,
                "rank_iter_s": times["plain"],
                "rank_iter_straggler_s": times["straggler"],
            }
        )
    return rows
