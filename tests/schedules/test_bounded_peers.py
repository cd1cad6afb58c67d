"""The default schedule keeps each rank's distinct peers bounded at large world sizes (issue 41,
item 6), simulated over the schedule alone (no processes), and is unchanged up to 16 ranks."""

from __future__ import annotations

import pytest

from dssync.schedules import Shuffle, consensus_error, default_schedule, peer_bound

AVERAGINGS = 500  # many cycles of the bounded schedule


def _peers(schedule, world: int, averagings: int = AVERAGINGS) -> list[set[int]]:
    """Each rank's distinct peers over ``averagings`` averagings (what nccl_like counts)."""
    seen: list[set[int]] = [set() for _ in range(world)]
    for t in range(averagings):
        for group in schedule.partition(t, world):
            for rank in group:
                seen[rank].update(r for r in group if r != rank)
    return seen


@pytest.mark.parametrize("world", [64, 65])
def test_each_rank_meets_a_bounded_set_of_peers_at_64_ranks(world):
    bound = peer_bound(world)
    assert bound == 2 * 7 if world == 65 else bound == 12
    peers = _peers(default_schedule(world), world)
    assert max(len(p) for p in peers) <= bound, max(len(p) for p in peers)
    fresh = _peers(Shuffle(2, uneven=world % 2 == 1), world, 100)  # the old default
    assert min(len(p) for p in fresh) > bound  # the check can fail: fresh pairs meet many more


def test_the_bounded_schedule_mixes_as_well_as_fresh_pairs():
    assert consensus_error(default_schedule(64), 64, 48) < 2 * consensus_error(Shuffle(2), 64, 48)


@pytest.mark.parametrize("world", [2, 3, 8, 15, 16])
def test_up_to_16_ranks_the_default_is_the_old_fresh_pairs(world):
    old = Shuffle(2, uneven=world % 2 == 1)
    new = default_schedule(world)
    assert new.describe() == old.describe()
    assert all(new.partition(t, world) == old.partition(t, world) for t in range(200))
