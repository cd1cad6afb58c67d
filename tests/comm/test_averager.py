"""GroupAverager stands where PyTorch's averagers stand, and averages exactly as they do."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer

from dssync import Global, GroupAverager, Shuffle
from dssync.lab.launch import spawn


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
    m(torch.randn(2, 6)).sum().backward()  # torch's averagers skip parameters without a gradient
    return m


def _global_vs_periodic():
    rank = dist.get_rank()
    ours, theirs = _model(10 + rank), _model(10 + rank)
    mine, torchs = GroupAverager(Global()), PeriodicModelAverager(period=1)
    for step in range(3):
        for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
            with torch.no_grad():
                noise = torch.randn(
                    a.shape, generator=torch.Generator().manual_seed(rank * 10 + step)
                )
                a.add_(noise)
                b.add_(noise)
        if step == 1:  # the optimizer's param_groups, as PostLocalSGDOptimizer passes them
            mine.average_parameters(torch.optim.SGD(ours.parameters(), lr=0.1).param_groups)
            torchs.average_parameters(torch.optim.SGD(theirs.parameters(), lr=0.1).param_groups)
        else:
            mine.average_parameters(ours.parameters())
            torchs.average_parameters(theirs.parameters())
    return (
        [p.detach().clone() for p in ours.parameters()],
        [p.detach().clone() for p in theirs.parameters()],
        mine.step,
        torchs.step,
    )


def test_global_averages_bit_for_bit_as_periodic_model_averager():
    for ours, theirs, step, torch_step in spawn(_global_vs_periodic, 3, timeout_s=120):
        assert step == torch_step == 3
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)


def _post_local_sgd():
    rank = dist.get_rank()
    m = _model(rank)
    averager = GroupAverager(Shuffle(2, seed=0), warmup_steps=2)
    opt = PostLocalSGDOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), averager)
    before = []
    for _ in range(4):
        m(torch.randn(3, 6)).sum().backward()
        before.append([p.detach().clone() for p in m.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=False)
    saved = opt.state_dict()
    fresh = PostLocalSGDOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1), GroupAverager(Shuffle(2, seed=0))
    )
    fresh.load_state_dict(saved)
    return saved["step"], fresh.averager.step, [p.detach().clone() for p in m.parameters()]


def test_works_inside_post_local_sgd_optimizer():
    out = spawn(_post_local_sgd, 2, timeout_s=120)
    for saved_step, restored_step, _ in out:
        assert saved_step == 4 and restored_step == 4  # the integer step is saved and restored
    for a, b in zip(out[0][2], out[1][2], strict=True):
        assert torch.equal(a, b)  # after warm-up the pair averaged: both ranks hold the same model
