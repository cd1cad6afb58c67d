"""WeightAverage (an equal-weight running mean of parameters) and batch-norm re-estimation."""

from __future__ import annotations

import torch
from torch import nn

from dssync.lab.train.swa import WeightAverage, recompute_batch_norm


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_running_mean_of_the_models_it_is_given():
    net = _net()
    swa = WeightAverage(net)
    snapshots = []
    for k in range(5):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(float(k + 1))
        snapshots.append([p.detach().clone() for p in net.parameters()])
        swa.update(net)
    assert swa.count == 5
    for avg, *seen in zip(swa.module.parameters(), *snapshots, strict=True):
        torch.testing.assert_close(avg, torch.stack(seen).mean(0))
    # its own copy: later training does not move the average
    with torch.no_grad():
        next(net.parameters()).add_(100.0)
    torch.testing.assert_close(
        next(swa.module.parameters()), torch.stack([s[0] for s in snapshots]).mean(0)
    )


def test_state_round_trip_keeps_the_count_and_the_mean():
    net = _net()
    swa = WeightAverage(net)
    swa.update(net)
    with torch.no_grad():
        next(net.parameters()).mul_(3.0)
    swa.update(net)
    again = WeightAverage(_net())
    again.load_state_dict(swa.state_dict())
    assert again.count == 2
    for a, b in zip(again.module.parameters(), swa.module.parameters(), strict=True):
        assert torch.equal(a, b)


def test_batch_norm_statistics_become_the_mean_over_the_batches():
    net = _net()
    data = [torch.randn(16, 3) * 2 + 1 for _ in range(4)]
    recompute_batch_norm(net, [(x, torch.zeros(len(x))) for x in data])
    bn = net[1]
    with torch.no_grad():
        hidden = torch.cat([net[0](x) for x in data])
    torch.testing.assert_close(bn.running_mean, hidden.mean(0), rtol=1e-4, atol=1e-5)
    assert bn.momentum == 0.1 and net.training  # settings put back
