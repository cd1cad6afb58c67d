"""AsyncDSSync and the parameter server on a training group with NCCL's rules (nccl_like).

Both move their request/answer messages on gloo groups of their own, made at construction
(``irecv(src=None)``, which NCCL cannot do), so a training group on nccl carries only their
start-up broadcast and final average: they are not refused there, and these runs show it. A
point-to-point receive from any source on the nccl_like group itself would raise
(``RuleBroken``), as would a point-to-point op before the first collective.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync.lab.launch import spawn


def _flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone()


def _run() -> dict:
    from dssync.lab.baselines.ps import ParameterServer
    from dssync.strategies.waitless import AsyncDSSync
    from dssync.testing import use_nccl_like_world

    use_nccl_like_world(timeout_s=60)
    assert dist.get_backend() == "nccl_like"
    rank = dist.get_rank()
    torch.manual_seed(0)
    m = nn.Linear(4, 3)
    sync = AsyncDSSync(m, timeout_s=20)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(rank)))
    for _ in range(6):
        sync.after_step()
    sync.settle()
    sync.average_all()
    waitless = _flat(m)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    ps = ParameterServer(m, opt, staleness=1, timeout_s=20)
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        nn.functional.mse_loss(m(torch.randn(6, 4, generator=g)), torch.randn(6, 2)).backward()
        ps.after_backward()
        opt.step()
        ps.after_step()
        opt.zero_grad()
    ps.average_all()
    return {"waitless": waitless, "ps": _flat(m)}


@pytest.mark.slow
def test_async_dssync_and_the_parameter_server_run_on_nccl_like():
    out = spawn(_run, 4, timeout_s=240)
    for o in out:
        assert torch.isfinite(o["waitless"]).all() and torch.isfinite(o["ps"]).all()
        assert torch.equal(o["waitless"], out[0]["waitless"])  # average_all: one model
        assert torch.equal(o["ps"], out[0]["ps"])
