"""DSSync's options run on nccl_like (NCCL's rules, gloo underneath) as on gloo, to the bit.

Each worker trains every case on its gloo world first, then switches its world to nccl_like
(``use_nccl_like_world``) and trains them again: the same operations in the same order on the
same transport must give the same bits, so a difference means dssync leaned on something NCCL
does not give (a tag, a bounded ``wait``, a point-to-point op before a collective) or broke a
rule (which raises). Pairs, groups of 3 (point to point) and 4 (the world), Global,
every/outer, int8/bf16 wires, fragments and overlap each run; a case's own semantics are
checked on gloo by tests/strategies.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync import DSSync, Global, Shuffle, nesterov
from dssync.lab.launch import spawn

STEPS = 4

CASES = {
    "pairs": {"schedule": Shuffle(2, seed=3)},
    "groups of 3": {"schedule": Shuffle(3, seed=4, uneven=True)},  # on 4 ranks: 3 and 1
    "groups of 4": {"schedule": Shuffle(4, seed=1)},
    "global": {"schedule": Global()},
    "every/outer": {"schedule": Shuffle(2, seed=2), "every": 2, "outer": nesterov()},
    "int8 groups of 3": {"schedule": Shuffle(3, seed=4, uneven=True), "wire": "int8"},
    "bf16 pairs": {"schedule": Shuffle(2, seed=5), "wire": "bf16"},
    "fragments": {"schedule": Shuffle(2, seed=6), "fragments": 2},
    "overlap": {"schedule": Shuffle(2, seed=7), "overlap": True},
}
QUICK = ("pairs", "global")


def _train(options: dict) -> list[torch.Tensor]:
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = DSSync(model, broadcast_init=False, timeout_s=30, **options)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        model(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sync.step()
    sync.average_all()
    sync.close()
    return [p.detach().clone() for p in model.parameters()]


def _both(names: list[str]) -> tuple[dict, dict, set[int]]:
    from dssync.testing import forget_peers, peers, use_nccl_like_world

    on_gloo = {n: _train(CASES[n]) for n in names}
    use_nccl_like_world(timeout_s=60)
    forget_peers()
    on_like = {n: _train(CASES[n]) for n in names}
    return on_gloo, on_like, peers()


def _check(names: list[str], world: int) -> None:
    out = spawn(_both, world, args=(names,), timeout_s=300)
    for rank, (on_gloo, on_like, seen) in enumerate(out):
        for n in names:
            for a, b in zip(on_gloo[n], on_like[n], strict=True):
                assert torch.equal(a, b), f"{n}: rank {rank} differs on nccl_like"
            for a, b in zip(on_like[n], out[0][1][n], strict=True):  # average_all: alike
                assert torch.equal(a, b), f"{n}: rank {rank} differs from rank 0"
        if world > 2:  # point to point really ran on nccl_like (on 2 ranks a pair is the world)
            assert seen and rank not in seen, seen


@pytest.mark.slow  # 18 s on the loaded 2-core machine
def test_pairs_and_global_run_on_nccl_like_as_on_gloo():
    _check(list(QUICK), 2)


@pytest.mark.slow
def test_every_option_runs_on_nccl_like_as_on_gloo():
    _check(list(CASES), 4)
