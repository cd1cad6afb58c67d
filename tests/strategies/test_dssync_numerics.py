"""DSSync.step() leaves each rank with its group's mean, checked against a one-process reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync import DSSync, Global, Shuffle, Static
from dssync.lab.launch import spawn
from dssync.schedules import group_of


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3))


def _state(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _one_step(schedule, steps: int, bucket_bytes: int):
    """Each rank starts from its own model; returns its state before and after each step."""
    rank = dist.get_rank()
    m = _model(100 + rank)
    with torch.no_grad():
        m[1].running_mean.add_(rank)  # distinct floating buffers per rank
        m[1].num_batches_tracked.fill_(rank)
    m.register_buffer("scale", torch.full((3,), rank + 0.1, dtype=torch.float64))  # a second dtype
    sync = DSSync(m, schedule=schedule, broadcast_init=False, bucket_bytes=bucket_bytes)
    history = [_state(m)]
    for _ in range(steps):
        with torch.no_grad():
            for p in m.parameters():  # a local "update" that differs per rank
                p.add_(0.1 * (rank + 1))
        history.append(_state(m))
        sync.step()
        history.append(_state(m))
    return history, sync.bucket_count


@pytest.mark.parametrize(
    ("world", "schedule", "bucket_bytes"),
    [
        (4, Shuffle(2, seed=3), 25 * 2**20),
        (3, Shuffle(2, seed=1, uneven=True), 64),
        (4, Static([[0, 1, 2], [3]]), 128),
        (5, Shuffle(3, seed=4, uneven=True), 64),
    ],  # a point-to-point group of 3,
)
def test_step_equals_group_mean(world, schedule, bucket_bytes):
    steps = 3
    out = spawn(_one_step, world, args=(schedule, steps, bucket_bytes), timeout_s=120)
    for s in range(steps):
        partition = schedule.partition(s, world)
        for rank in range(world):
            group = group_of(partition, rank)
            after = out[rank][0][2 * s + 2]
            for key, value in after.items():
                before = [out[r][0][2 * s + 1][key] for r in group]
                if value.is_floating_point():
                    expected = torch.stack(before).mean(0)
                    torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-6)
                    assert value.dtype == before[0].dtype
                    # every member holds the very same bits, whichever side of the exchange it was
                    assert torch.equal(value, out[group[0]][0][2 * s + 2][key])
                else:  # integer buffers are left alone
                    assert torch.equal(value, out[rank][0][2 * s + 1][key])
    if bucket_bytes < 100:
        assert out[0][1] > 1  # small bucket cap really splits the model into several buckets


def _global_vs_plain():
    rank, world = dist.get_rank(), dist.get_world_size()
    m = _model(7 + rank)
    plain = [p.detach().clone() for p in m.parameters()]
    for p in plain:
        dist.all_reduce(p)
        p /= world
    sync = DSSync(m, schedule=Global(), broadcast_init=False)
    sync.step()
    return [p.detach().clone() for p in m.parameters()], plain


def test_global_is_plain_parameter_averaging():
    out = spawn(_global_vs_plain, 3, timeout_s=120)
    for got, plain in out:
        for a, b, first in zip(got, plain, out[0][0], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            assert torch.equal(a, first)  # every rank holds the very same model


def _broadcast_init():
    m = _model(dist.get_rank())
    DSSync(m)
    return _state(m)


def test_construction_starts_from_rank0():
    states = spawn(_broadcast_init, 2, timeout_s=120)
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
    assert torch.equal(states[0]["0.weight"], _state(_model(0))["0.weight"])
