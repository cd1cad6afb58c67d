"""Steps to consensus and spectral gaps, against exact dense products on small cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dssync.lab.plan import consensus
from dssync.lab.plan.consensus import consensus_steps, expected_gap
from dssync.lab.plan.cost import Repeating
from dssync.schedules import (
    Butterfly,
    Global,
    Schedule,
    Shuffle,
    Static,
    mixing_matrix,
    spectral_gap,
)


def exact_steps(schedule, n: int, eps: float = 1e-3, cap: int = 2000) -> int:
    """The dense count, worst over the step of the cycle one starts at."""
    j = np.full((n, n), 1.0 / n)
    worst = 0
    for phase in range(schedule.cycle(n)):
        p = np.eye(n)
        for t in range(1, cap + 1):
            p = mixing_matrix(schedule.partition(phase + t - 1, n), n) @ p
            if np.linalg.norm(p - j, 2) <= eps:
                break
        worst = max(worst, t)
    return worst


def test_butterfly_pairs_reach_exact_consensus_in_log2_steps():
    assert consensus_steps(Butterfly(2), 4) == 2
    assert consensus_steps(Butterfly(2), 8) == 3
    assert consensus_steps(Global(), 8) == 1
    assert expected_gap(Butterfly(2), 4) == pytest.approx(0.5)


def test_static_groups_never_agree():
    assert math.isinf(consensus_steps(Static(2), 8))
    assert expected_gap(Static(2), 8) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("n", [8, 16, 32, 64])
def test_shuffle_steps_match_the_exact_dense_count(n):
    schedule = Repeating(Shuffle(2, seed=0), 8)
    est, exact = consensus_steps(schedule, n), exact_steps(schedule, n)
    assert exact - 1 <= est <= exact + 1


def test_matrix_free_gap_matches_the_dense_one(monkeypatch):
    schedule = Repeating(Shuffle(2, seed=3), 8)
    dense = spectral_gap(schedule, 160, steps=8)
    monkeypatch.setattr(consensus, "DENSE_UP_TO", 0)
    assert expected_gap(schedule, 160) == pytest.approx(dense, abs=1e-6)


def test_groups_that_never_join_some_ranks_never_agree():
    left_right = Static([[0, 1], [2, 3], [4, 5], [6, 7]])
    assert math.isinf(consensus_steps(left_right, 8))
    chain = Repeating(Butterfly(2), 2)  # only the first two of three axes: halves never meet
    assert math.isinf(consensus_steps(chain, 8))
    assert consensus_steps(Repeating(Butterfly(2), 3), 8) == 3


def test_the_count_is_the_worst_over_where_in_the_cycle_one_starts():
    # ranks 0 and 1 meet once every 4 steps: from step 1 it takes until step 4
    once = Repeating(Static([[0, 1]]), 1)
    rare = Repeating(_Seq([[[0, 1]], [[0], [1]], [[0], [1]], [[0], [1]]]), 4)
    assert consensus_steps(once, 2) == 1
    assert consensus_steps(rare, 2) == 4


class _Seq(Schedule):
    """The given partitions in turn."""

    def __init__(self, partitions):
        self.partitions = partitions

    def partition(self, step, world_size):
        return self.partitions[step % len(self.partitions)]

    def cycle(self, world_size):
        return len(self.partitions)
