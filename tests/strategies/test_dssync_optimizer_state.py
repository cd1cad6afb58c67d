"""DSSync(optimizer=...) averages momentum inside the group; without it momentum stays local."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dssync import DSSync, Static
from dssync.lab.launch import spawn


def _momentum(average: bool):
    rank = dist.get_rank()
    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    sync = DSSync(m, schedule=Static([[0, 1]]), optimizer=opt if average else None)
    (m(torch.full((4, 3), float(rank + 1))) ** 2).sum().backward()
    opt.step()
    before = [opt.state[p]["momentum_buffer"].clone() for p in m.parameters()]
    sync.step()
    after = [opt.state[p]["momentum_buffer"].clone() for p in m.parameters()]
    return before, after


def test_momentum_is_averaged_only_when_asked():
    on = spawn(_momentum, 2, args=(True,), timeout_s=120)
    for i in range(2):
        mean = (on[0][0][i] + on[1][0][i]) / 2
        assert not torch.equal(on[0][0][i], on[1][0][i])  # the ranks' momenta really differed
        torch.testing.assert_close(on[0][1][i], mean)
        torch.testing.assert_close(on[1][1][i], mean)
    off = spawn(_momentum, 2, args=(False,), timeout_s=120)
    for rank in range(2):
        for before, after in zip(off[rank][0], off[rank][1], strict=True):
            assert torch.equal(before, after)
