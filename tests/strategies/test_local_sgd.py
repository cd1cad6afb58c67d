"""Local SGD: ranks drift apart between averages and hold the global mean right after one."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dssync.lab.baselines import LocalSGD, Solo
from dssync.lab.launch import spawn


def _local_sgd():
    rank = dist.get_rank()
    m = nn.Linear(3, 2)
    strategy = LocalSGD(m, every=2)
    seen = []
    for _ in range(4):
        with torch.no_grad():
            m.weight.add_(rank + 1)
        strategy.after_step()
        seen.append(m.weight.detach().clone())
    return seen


def test_average_every_h_steps():
    out = spawn(_local_sgd, 3, timeout_s=120)
    start = out[0][1] - 2 * 2  # rank 0's weight after step 2 is the mean: start + 2 * mean(1, 2, 3)
    for rank, seen in enumerate(out):
        assert not torch.equal(seen[0], out[(rank + 1) % 3][0])  # step 1: no average yet
        for s in (1, 3):  # steps 2 and 4: every rank holds the same mean
            assert torch.equal(seen[s], out[0][s])
    torch.testing.assert_close(out[0][3], start + 4 * 2.0)


def _solo():
    rank = dist.get_rank()
    m = nn.Linear(3, 2)
    strategy = Solo(m)
    start = m.weight.detach().clone()  # rank 0's, broadcast at construction
    for _ in range(5):
        with torch.no_grad():
            m.weight.add_(rank + 1)
        strategy.step()
    apart = m.weight.detach().clone()
    strategy.average_all()
    return start, apart, m.weight.detach().clone()


def test_solo_never_averages_while_training_and_averages_once_at_the_end():
    out = spawn(_solo, 3, timeout_s=120)
    start = out[0][0]
    for rank, (s, apart, end) in enumerate(out):
        assert torch.equal(s, start)
        torch.testing.assert_close(apart, start + 5.0 * (rank + 1))  # its own steps only
        torch.testing.assert_close(end, start + 10.0)  # 5 * mean(1, 2, 3)
