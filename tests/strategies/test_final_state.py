"""After ``average_all()`` every rank holds the same model, buffers and all (issue 27, item 1).

A BatchNorm model keeps an integer counter (``num_batches_tracked``) that no average touches; a
bool buffer is there too. Ranks that ran a different number of forward passes must still end
with one ``state_dict``: the same hash on every rank, and rank 0's counters.
"""

from __future__ import annotations

import hashlib
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join

from dssync import DSSync, Shuffle
from dssync.comm import inflight
from dssync.lab.baselines.protocol import after_backward
from dssync.lab.config import TrainConfig
from dssync.lab.launch import spawn
from dssync.lab.methods import METHODS, build_strategy, is_elastic
from dssync.topology import Topology


def _model() -> nn.Module:
    torch.manual_seed(dist.get_rank())  # ranks start apart; the strategy aligns them
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model.register_buffer("mask", torch.tensor([dist.get_rank() == 0, True, False]))
    return model


def _state_hash(module: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _batches(count: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    return [torch.randn(5, 6, generator=g) for _ in range(count)]


def _uneven_join() -> tuple[str, int]:
    """DSSync under Join: rank 0 has 7 batches, rank 1 has 4 (the README's recipe)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = DSSync(model, schedule=Shuffle(2, seed=0), timeout_s=30)
    with Join([sync]):
        for x in _batches(7 if dist.get_rank() == 0 else 4):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            sync.step()
    sync.average_all()
    return _state_hash(model), int(model[1].num_batches_tracked)


@pytest.mark.timeout(180)
def test_uneven_data_under_join_ends_with_one_state_dict():
    (h0, n0), (h1, n1) = spawn(_uneven_join, 2, timeout_s=150)
    assert (n0, n1) == (7, 7)  # rank 0's count, on both (it was 7 and 4)
    assert h0 == h1


METHOD_NAMES = [
    n for n, m in METHODS.items() if n != "auto" and not is_elastic(n)
]  # elastic: tests/elastic


def _every_method() -> dict[str, tuple[str, int, int] | str]:
    out: dict[str, tuple[str, int, int] | str] = {}
    topology = Topology(hosts=(0, 1), racks=(0, 0))
    for name in METHOD_NAMES:
        try:
            model = _model()
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            local = {"every": 100} if name == "local-sgd" else {}  # no average before the end
            cfg = TrainConfig(sync=name, timeout_s=30, **local)
            strategy = build_strategy(cfg, model, opt, topology)
            for x in _batches(3):
                strategy.model(x).pow(2).mean().backward()
                after_backward(strategy)
                opt.step()
                strategy.after_step()
                opt.zero_grad()
            if dist.get_rank() == 1:  # one more forward pass here: other statistics, counter
                model(torch.randn(5, 6))
            strategy.average_all()
            if hasattr(strategy, "close"):
                strategy.close()
            time.sleep(0.2)  # gloo's threads let go of the last works
            held = len(inflight.held())  # else every exit would wait for them (its whole bound)
            out[name] = (_state_hash(model), int(model[1].num_batches_tracked), held)
        except Exception as e:  # noqa: BLE001 - reported per method to the parent
            out[name] = f"{type(e).__name__}: {str(e)[:300]}"
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def every_method() -> list[dict]:
    return spawn(_every_method, 2, timeout_s=400)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_method_ends_with_one_state_dict(every_method, name):
    r0, r1 = every_method[0][name], every_method[1][name]
    assert not isinstance(r0, str) and not isinstance(r1, str), (r0, r1)
    assert r0[1] == r1[1] == 3  # rank 0's counter (rank 1 had 4)
    assert r0[0] == r1[0]
    assert r0[2] == r1[2] == 0  # no tensor dssync lent to a collective is still held
