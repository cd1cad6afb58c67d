"""The lane: averages on a thread and a group of their own, with the bits of the blocking core."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from dssync.comm.averager import Router
from dssync.comm.lane import Lane
from dssync.comm.tags import OVERLAP, STEP
from dssync.errors import PeerLost, SyncError
from dssync.lab.launch import spawn


def _buffers(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(3000, generator=g), torch.randn(17, generator=g).double()]


def _same_bits_as_blocking(group: list[int], chunk_bytes: int):
    rank = dist.get_rank()
    lane = Lane(None, timeout_s=30)
    lane.router.transport.chunk_bytes = chunk_bytes  # several chunks through the window
    router = Router(None, timeout_s=30, chunk_bytes=chunk_bytes)
    mine = _buffers(rank)
    given = [b.clone() for b in mine]
    talk = torch.full((4,), float(rank))
    pending = lane.start(group if rank in group else [rank], OVERLAP, 3, mine)
    # The caller's own traffic on the training group while the lane's average runs.
    for _ in range(5):
        dist.all_reduce(talk)
    means = pending.wait()
    lane.close()
    untouched = all(torch.equal(a, b) for a, b in zip(mine, given, strict=True))
    blocking = [b.clone() for b in mine]
    router.average(group if rank in group else [rank], STEP, 3, buffers=blocking)
    same = all(torch.equal(a, b) for a, b in zip(means, blocking, strict=True))
    return untouched, same, means[0][:4].tolist(), talk.tolist()


@pytest.mark.parametrize(
    ("world", "group", "chunk_bytes"),
    [
        (2, [0, 1], 1024),
        pytest.param(3, [0, 2], 1024, marks=pytest.mark.slow),
        (3, [0, 1, 2], 4 * 1024 * 1024),
        pytest.param(4, [1, 2, 3], 512, marks=pytest.mark.slow),
    ],
)
def test_lane_gives_the_blocking_bits_and_leaves_buffers_alone(world, group, chunk_bytes):
    out = spawn(_same_bits_as_blocking, world, args=(group, chunk_bytes), timeout_s=120)
    expected = sum(float(r) for r in range(world)) * world**4  # five sums over the world
    for rank, (untouched, same, head, talk) in enumerate(out):
        assert untouched
        assert same
        assert talk == [expected] * 4
        if rank in group:
            assert head == out[group[0]][2]  # every member holds the same mean
    outsider = [r for r in range(world) if r not in group]
    for r in outsider:
        assert out[r][2] == _buffers(r)[0][:4].tolist()  # a group of one keeps its own


def _peer_never_comes():
    lane = Lane(None, timeout_s=2)
    if dist.get_rank() == 2:
        return "outside"  # a pair of 3 ranks: the point-to-point path, not a collective
    if dist.get_rank() == 1:
        time.sleep(8)  # never starts its side of the average within rank 0's timeout
        lane.close()
        return "slept"
    began = time.monotonic()
    pending = lane.start([0, 1], OVERLAP, 0, [torch.ones(100)])
    # named as what it is: kind 5 was both the bandwidth probe and this (issue 41)
    with pytest.raises(
        PeerLost,
        match=r"^an overlapped average at averaging 0 in group \[0, 1\]: rank 1 never came",
    ):
        pending.wait()
    return time.monotonic() - began


def test_a_peer_that_never_starts_is_reported_within_the_timeout():
    waited, slept, _ = spawn(_peer_never_comes, 3, timeout_s=120)
    assert slept == "slept"
    assert waited < 6  # the wait's 2 s bound, well before the peer wakes (8 s) or the grace ends


def _steps_differ():
    lane = Lane(None, timeout_s=20)
    rank = dist.get_rank()
    if rank == 2:
        return "outside"
    pending = lane.start([0, 1], OVERLAP, 3 + rank, [torch.ones(5000)])  # rank 1 a step ahead
    with pytest.raises(SyncError, match="step"):
        pending.wait()
    return "refused"


def test_a_pair_at_different_steps_raises_in_the_callers_thread():
    assert spawn(_steps_differ, 3, timeout_s=120) == ["refused", "refused", "outside"]
