"""Hierarchical all-reduce leaves every rank with exactly the global mean gradient."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dssync.lab.baselines.hierarchical import Hierarchical
from dssync.lab.launch import spawn
from dssync.topology import Topology


def _batch(rank: int) -> torch.Tensor:
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(rank + 1))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3))


def _grads_each(cases) -> list[list[torch.Tensor]]:
    return [_grads(topology, bucket_bytes) for topology, bucket_bytes in cases]


def _grads(topology: Topology, bucket_bytes: int) -> list[torch.Tensor]:
    m = _model()
    strategy = Hierarchical(m, topology, bucket_bytes=bucket_bytes)
    strategy.time_sync()
    m(_batch(dist.get_rank())).pow(2).sum().backward()
    strategy.after_backward()
    assert strategy.take_sync_time() > 0
    return [p.grad.clone() for p in m.parameters()]


CASES = [
    (Topology(hosts=(0, 0, 1, 1), racks=(0, 0, 0, 0)), 64),  # 2 hosts, reduce by host
    (Topology(hosts=(0, 1, 2, 3), racks=(0, 0, 1, 1)), 25 * 2**20),  # 2 racks
]


def test_global_mean_gradient():
    out = spawn(_grads_each, 4, args=(CASES,), timeout_s=60)
    ref = _model()
    for r in range(4):
        ref(_batch(r)).pow(2).sum().backward()
    expected = [p.grad / 4 for p in ref.parameters()]
    for grads in (g for per_rank in out for g in per_rank):
        for g, e in zip(grads, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def _buffers_and_subgroup():
    """Ranks 0-3 form the process group; batch-norm statistics end equal on every member."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
    strategy = Hierarchical(
        m,
        Topology(hosts=(0, 0, 1, 1), racks=(0, 0, 0, 0)),
        process_group=dist.new_group([0, 1, 2, 3]),
    )
    m(_batch(rank)).pow(2).sum().backward()  # running statistics now differ per rank
    strategy.after_backward()
    strategy.after_step()
    return m[1].running_mean.clone(), m[1].running_var.clone()


def test_buffers_are_averaged_inside_the_process_group():
    """Hierarchical used to take no process group and never average buffers."""
    out = spawn(_buffers_and_subgroup, 4, timeout_s=120)
    for mean, var in out:
        assert torch.equal(mean, out[0][0]) and torch.equal(var, out[0][1])
    assert not torch.equal(out[0][0], torch.zeros(4))
