"""Schedules are pure: coverage, determinism, exact averaging, spectral gaps."""

from __future__ import annotations

import doctest
import subprocess
import sys

import numpy as np
import pytest

import dssync.schedules.base
import dssync.schedules.basic
from dssync.errors import UsageError
from dssync.schedules import (
    Butterfly,
    Global,
    Shuffle,
    Static,
    check_partition,
    consensus_error,
    mixing_matrix,
    product_matrix,
    schedule_from_name,
    spectral_gap,
)

ALL = [
    Shuffle(2, uneven=True),
    Shuffle(3, seed=5, uneven=True),
    Shuffle(2, repeat=4, uneven=True),
    Butterfly(2),
    Butterfly(3),
    Static(2, uneven=True),
    Global(),
]


@pytest.mark.parametrize("schedule", ALL, ids=repr)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16])
def test_every_partition_covers_each_rank_once(schedule, world):
    k = getattr(schedule, "group_size", 1)
    if isinstance(schedule.__dict__.get("groups"), int):
        k = schedule.groups
    if k > world:
        with pytest.raises(ValueError, match="larger than world_size"):
            schedule.partition(0, world)
        return
    for step in range(12):
        p = schedule.partition(step, world)
        check_partition(p, world)
        sizes = [len(g) for g in p]
        if isinstance(schedule, Shuffle | Static):
            assert max(sizes) - min(sizes) <= 1 and max(sizes) <= k


def test_uneven_world_gives_groups_differing_by_one():
    assert [len(g) for g in Shuffle(2, uneven=True).partition(0, 3)] in ([2, 1], [1, 2])
    assert sorted(len(g) for g in Shuffle(4, uneven=True).partition(7, 10)) == [3, 3, 4]


@pytest.mark.parametrize("schedule", [Shuffle(3), Static(3), Shuffle(3, repeat=4)], ids=repr)
def test_group_size_that_does_not_divide_is_refused(schedule):
    """Shuffle(3) on 4 ranks used to become pairs silently."""
    with pytest.raises(
        UsageError,
        match=r"group_size=3 does not divide world_size=4; use 1, 2 or 4, "
        r"or pass uneven=True",
    ):
        schedule.partition(0, 4)
    assert [len(g) for g in schedule.partition(0, 6)] == [3, 3]


def test_partitions_depend_only_on_seed_and_step_across_processes():
    code = "from dssync.schedules import Shuffle; print([Shuffle(2, seed=11).partition(s, 8) for s in range(5)])"
    runs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        for _ in range(2)
    }
    assert len(runs) == 1
    assert runs.pop().strip() == repr([Shuffle(2, seed=11).partition(s, 8) for s in range(5)])
    assert Shuffle(2, seed=1).partition(0, 8) != Shuffle(2, seed=2).partition(0, 8) or Shuffle(
        2, seed=1
    ).partition(1, 8) != Shuffle(2, seed=2).partition(1, 8)


def test_shuffle_repeat_repeats():
    s = Shuffle(2, seed=3, repeat=3)
    assert [s.partition(t, 8) for t in range(3)] == [s.partition(t, 8) for t in range(3, 6)]
    assert s.cycle(8) == 3 and Shuffle(2).cycle(8) is None


@pytest.mark.parametrize(
    ("k", "world"), [(2, 4), (2, 8), (2, 16), (3, 9), (4, 16), (2, 6), (3, 12)]
)
def test_butterfly_exact_average_after_its_rounds(k, world):
    b = Butterfly(k)
    rounds = b.cycle(world)
    if world == k**rounds:
        assert rounds == round(np.log(world) / np.log(k))
    prod = product_matrix(b, world, start=0, steps=rounds)
    np.testing.assert_allclose(prod, np.full((world, world), 1 / world), atol=1e-12)
    assert consensus_error(b, world, rounds, start=5) < 1e-12  # from any step


def test_butterfly_matches_the_two_partition_pattern_for_four_workers():
    assert Butterfly(2).partition(0, 4) == [[0, 1], [2, 3]]
    assert Butterfly(2).partition(1, 4) == [[0, 2], [1, 3]]


def test_mixing_matrix_is_doubly_stochastic_group_average():
    w = mixing_matrix([[0, 2], [1], [3, 4, 5]], 6)
    np.testing.assert_allclose(w.sum(0), 1)
    np.testing.assert_allclose(w.sum(1), 1)
    assert w[0, 2] == 0.5 and w[1, 1] == 1 and w[3, 5] == pytest.approx(1 / 3) and w[0, 1] == 0


def test_spectral_gaps():
    assert spectral_gap(Static([[0, 1], [2, 3]]), 4) == pytest.approx(0, abs=1e-12)
    assert spectral_gap(Static(2), 8) == pytest.approx(0, abs=1e-12)
    assert spectral_gap(Shuffle(2), 8) > 0.1
    assert spectral_gap(Butterfly(2), 8, steps=3) > 0.1
    assert spectral_gap(Global(), 8) == pytest.approx(1)
    assert consensus_error(Static(2), 8, 10) == pytest.approx(1)


def test_bad_group_size_is_named():
    with pytest.raises(ValueError, match="group_size=0 must be an integer >= 1"):
        Shuffle(0)
    with pytest.raises(
        ValueError, match="group_size=5 is larger than world_size=4; use a group size from 1 to 4"
    ):
        Shuffle(5).partition(0, 4)
    with pytest.raises(ValueError, match="does not cover ranks"):
        Static([[0, 1], [1, 2]]).partition(0, 3)
    with pytest.raises(ValueError, match="unknown schedule 'ring'"):
        schedule_from_name("ring")


def test_fingerprint_differs_with_settings():
    assert Shuffle(2, seed=1).fingerprint(4) == Shuffle(2, seed=1).fingerprint(4)
    assert Shuffle(2, seed=1).fingerprint(4) != Shuffle(2, seed=2).fingerprint(4)
    assert Shuffle(2).fingerprint(4) != Butterfly(2).fingerprint(4)


@pytest.mark.parametrize("module", [dssync.schedules.base, dssync.schedules.basic])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
