"""Overlapped DS-Sync (``overlap=True``): exact means one step later, consensus, bit-exact resume."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync import Butterfly, DSSync, Global, Shuffle, Static
from dssync.errors import SyncError, UsageError
from dssync.lab.launch import spawn
from dssync.schedules.topology import plan_topology_aware
from dssync.topology import Topology


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3))


def _flat(m: nn.Module) -> torch.Tensor:
    """Parameters and buffers, read without state_dict() (which would merge a pending average)."""
    tensors = [*m.parameters(), *m.buffers()]
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def _zero_lr(cls_name: str, schedule, steps: int):
    """Distinct starting models, no local updates: the state after each step()."""
    rank = dist.get_rank()
    m = _model(10 + rank)
    with torch.no_grad():
        m[1].running_mean.add_(rank)
    sync = DSSync(m, schedule=schedule, broadcast_init=False, overlap=cls_name == "overlap")
    out = [_flat(m)]
    for _ in range(steps):
        sync.step()
        out.append(_flat(m))
    getattr(sync, "finish", lambda: None)()  # nothing left in flight when the ranks leave
    return out


@pytest.mark.parametrize(
    ("world", "schedule"),
    [
        (4, Butterfly(2)),  # pairs: point to point
        (3, Shuffle(2, uneven=True)),  # a group of three that never repeats: point to point
        (4, Static([[0, 1, 2], [3]])),  # a made group: collective
        (2, Global()),  # the whole group: collective on it
    ],
)
def test_zero_lr_matches_blocking_one_step_later(world, schedule):
    steps = 3
    blocking = spawn(_zero_lr, world, args=("blocking", schedule, steps), timeout_s=180)
    overlap = spawn(_zero_lr, world, args=("overlap", schedule, steps), timeout_s=180)
    for r in range(world):
        assert torch.equal(overlap[r][1], overlap[r][0])  # the first step only starts
        for t in range(steps):
            assert torch.equal(overlap[r][t + 1], blocking[r][t]), (r, t)
    if isinstance(schedule, Butterfly):  # two butterfly steps: every rank holds the global mean
        mean = torch.stack([overlap[r][0] for r in range(world)]).mean(0)
        for r in range(world):
            assert torch.equal(overlap[r][3], overlap[0][3])
            assert torch.allclose(overlap[r][3], mean, atol=1e-6)
        assert not torch.allclose(overlap[0][2], overlap[3][2])  # not yet after one merge


def _train(steps: int, cls_name: str):
    rank = dist.get_rank()
    torch.manual_seed(0)
    w_true = torch.randn(8, 1)
    m = nn.Linear(8, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    topo = Topology(hosts=(0, 0, 1, 1), racks=(0, 0, 1, 1))
    if cls_name == "topo":
        sync = DSSync(m, topology=topo, overlap=True, optimizer=opt)
    elif cls_name == "topo-blocking":
        sync = DSSync(m, schedule=plan_topology_aware(topo), optimizer=opt)
    else:
        sync = DSSync(m, schedule=Shuffle(2, seed=1), overlap=True, optimizer=opt)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        y = x @ w_true + 0.1 * rank  # ranks see different data
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sync.step()
        losses.append(loss.item())
    getattr(sync, "finish", lambda: None)()
    p = torch.cat([t.detach().reshape(-1) for t in m.parameters()])
    everyone = [torch.empty_like(p) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, p)
    spread = max((q - p).norm().item() for q in everyone)
    sync.average_all()
    final = torch.cat([t.detach().reshape(-1) for t in m.parameters()])
    return losses, spread, final, getattr(sync, "pending", False)


def test_training_converges_and_ranks_agree():
    out = spawn(_train, 4, args=(60, "shuffle"), timeout_s=240)
    for losses, spread, final, pending in out:
        assert sum(losses[-10:]) / 10 < 0.2 * sum(losses[:5]) / 5
        assert spread < 0.05
        assert not pending
        assert torch.equal(final, out[0][2])


def test_topology_plan_keeps_ranks_as_close_as_blocking():
    """Hosts see different data and cross rarely: spread as blocking DS-Sync on the same plan."""
    out = spawn(_train, 4, args=(60, "topo"), timeout_s=240)
    blocking = spawn(_train, 4, args=(60, "topo-blocking"), timeout_s=240)
    assert out[0][1] < 1.5 * blocking[0][1] + 0.01
    for losses, _, final, pending in out:
        assert sum(losses[-10:]) / 10 < 0.2 * sum(losses[:5]) / 5
        assert not pending and torch.equal(final, out[0][2])


def _resume(stop: int, total: int):
    """A run never stopped; one saving at ``stop`` and going on; one rebuilt from that save."""
    rank = dist.get_rank()

    def build():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        return m, opt, DSSync(m, schedule=Shuffle(2, seed=3), overlap=True, optimizer=opt)

    def batch(step):
        g = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(8, 6, generator=g), torch.randint(0, 2, (8,), generator=g)

    def train(m, opt, sync, steps, merge=True):
        for s in steps:
            x, y = batch(s)
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            sync.step()
        if merge:
            sync.finish()
        return _flat(m)

    never_stopped = train(*build(), range(total))
    m, opt, sync = build()
    train(m, opt, sync, range(stop), merge=False)
    saved = _clone({"model": m.state_dict(), "opt": opt.state_dict(), "sync": sync.state_dict()})
    assert saved["sync"]["overlap"] is not None  # an average arrived, to be merged next step
    saved_and_went_on = train(m, opt, sync, range(stop, total))

    m2, opt2, sync2 = build()
    m2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    sync2.load_state_dict(saved["sync"])
    return never_stopped, saved_and_went_on, train(m2, opt2, sync2, range(stop, total))


def _clone(obj):
    if torch.is_tensor(obj):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def test_resume_is_bit_exact():
    for never_stopped, saved, resumed in spawn(_resume, 2, args=(5, 12), timeout_s=180):
        assert torch.equal(saved, never_stopped)  # saving does not change the run
        assert torch.equal(resumed, never_stopped)


def _mixed():
    m = _model(0)
    with pytest.raises(UsageError, match="overlap") as caught:
        DSSync(m, schedule=Shuffle(2, seed=0), timeout_s=20, overlap=dist.get_rank() == 0)
    return str(caught.value)


def test_overlapped_and_blocking_ranks_are_told_apart():
    """Refused at start, on every rank, before the overlapped rank makes its lane's group."""
    for message in spawn(_mixed, 2, timeout_s=120):
        assert "same overlap=" in message


def _out_of_step():
    m = _model(0)
    sync = DSSync(m, schedule=Shuffle(2, seed=0), timeout_s=20, overlap=True)
    if dist.get_rank() == 0:
        sync.averagings = 3  # one rank skipped steps: the tags of its averages differ
    with pytest.raises(SyncError):
        sync.step()
        sync.step()
        sync.finish()
    return True


def test_ranks_out_of_step_raise():
    assert spawn(_out_of_step, 2, timeout_s=120) == [True, True]
