"""Group cache stays bounded and leaks no sockets; buckets lay tensors out as views."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync import DSSync, Shuffle
from dssync.comm import FlatBuckets, GroupCache, plan_buckets
from dssync.lab.launch import spawn


def test_plan_buckets_respects_cap_and_kinds():
    ts = [
        torch.zeros(10),
        torch.zeros(10),
        torch.zeros(30),
        torch.zeros(5, dtype=torch.float64),
        torch.zeros(1),
    ]
    plan = plan_buckets(ts, bucket_bytes=80)
    assert [len(b) for b in plan] == [2, 1, 1, 1]  # 40+40 bytes; 120 alone; 4 bytes; float64 apart
    assert all(len({t.dtype for t in b}) == 1 for b in plan)


def test_flat_buckets_are_views_and_keep_values():
    m = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    before = [p.detach().clone() for p in m.parameters()]
    b = FlatBuckets(list(m.parameters()), bucket_bytes=48)
    assert len(b.buffers) > 1 and b.numel == sum(p.numel() for p in before)
    for p, v in zip(m.parameters(), before, strict=True):
        assert torch.equal(p, v)
    b.buffers[0].fill_(3.0)
    assert torch.all(next(m.parameters()) == 3.0)
    assert b.intact()
    m[0].weight.data = m[0].weight.data.clone()
    assert not b.intact()
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        FlatBuckets(list(m.parameters()), bucket_bytes=0)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _no_groups_after_construction(steps: int, schedule):
    torch.manual_seed(0)
    sync = DSSync(nn.Linear(8, 8), schedule=schedule)
    at_start, fds = sync.groups_created, _open_fds()
    for _ in range(steps):
        sync.step()
    return at_start, sync.groups_created, fds, _open_fds()


@pytest.mark.parametrize(
    ("world", "schedule", "made"),
    [
        (4, Shuffle(2, seed=1), 0),  # pairs: point-to-point on the parent group
        (6, Shuffle(3, seed=1), 0),  # never repeats, groups of 3: point-to-point too
        (6, Shuffle(3, seed=1, repeat=3), None),  # repeats: its groups made once, at construction
    ],
)
def test_no_group_is_created_after_construction(world, schedule, made):
    """Pairs used to create a process group whenever a pair was new, inside the timed step."""
    for at_start, after, fds_start, fds_end in spawn(
        _no_groups_after_construction, world, args=(30, schedule), timeout_s=240
    ):
        assert after == at_start, "a process group was created after construction"
        if made is not None:
            assert at_start == made
        assert fds_end <= fds_start + 2


def _cache_get_unprepared():
    cache = GroupCache()
    try:
        cache.get([0, 1])
    except RuntimeError as e:
        return str(e)
    return ""


def test_unprepared_group_is_an_error():
    assert "prepare(partition)" in spawn(_cache_get_unprepared, 3, timeout_s=60)[0]


def _inside_subgroup():
    """Ranks 0-2 shuffle pairs among themselves; rank 3 is a process group of its own."""
    rank = dist.get_rank()
    parts = [dist.new_group([0, 1, 2]), dist.new_group([3])]
    mine = parts[0 if rank < 3 else 1]
    m = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        m.weight.fill_(float(rank))
    sync = DSSync(
        m,
        schedule=Shuffle(2 if rank < 3 else 1, seed=0, uneven=True),
        process_group=mine,
        broadcast_init=False,
    )
    partition = sync.schedule.partition(0, dist.get_world_size(mine))
    sync.step()
    return partition, float(m.weight[0, 0]), sync.groups_created


def test_dssync_inside_a_subgroup_averages_only_there():
    out = spawn(_inside_subgroup, 4, timeout_s=120)
    partition = out[0][0]
    for group in partition:  # group ranks 0..2 are global ranks 0..2 here
        assert all(out[r][1] == sum(group) / len(group) for r in group)
        for r in group:  # pairs exchange point to point: no group is created
            assert out[r][2] == 0
    assert out[3][1] == 3.0
