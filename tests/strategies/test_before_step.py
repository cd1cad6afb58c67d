"""DSSync with AdamW reaches DDP's loss: averaging gradients, parameters and moments at the step."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dssync import DSSync, Shuffle
from dssync.errors import UsageError
from dssync.lab.launch import spawn
from dssync.strategies.before_step import BeforeStep, is_adaptive
from dssync.strategies.hooks import Averaging
from dssync.strategies.options import Options

STEPS = 300


def _problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return x, x @ w + 2.0 * torch.randn(2048, 1, generator=g)  # noisy: per-rank variance matters


def _ddp_and_dssync(average_grads: bool | None, closure: bool = False) -> tuple[float, float]:
    """Train the same model on the same batches under DDP and under DSSync; held-out losses."""
    torch.set_num_threads(1)
    rank = dist.get_rank()
    x, y = _problem()
    results = []
    for kind in ("ddp", "dssync"):
        torch.manual_seed(0)
        model = nn.Linear(16, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
        if kind == "ddp":
            fwd, sync = DDP(model), None
        else:
            sync = DSSync(model, Shuffle(2, seed=0), optimizer=opt, average_grads=average_grads)
            fwd = model
        batches = torch.Generator().manual_seed(1 + rank)
        for _ in range(STEPS):
            i = torch.randint(0, 1536, (4,), generator=batches)
            if closure:  # as Lightning steps: backward inside optimizer.step(closure)

                def loss_and_grads(i=i, fwd=fwd):
                    loss = nn.functional.mse_loss(fwd(x[i]), y[i])
                    loss.backward()
                    return loss

                opt.step(loss_and_grads)
            else:
                nn.functional.mse_loss(fwd(x[i]), y[i]).backward()
                opt.step()
            if sync is not None:
                sync.step()
            opt.zero_grad(set_to_none=True)
        if sync is not None:
            sync.average_all()
            sync.close()
        with torch.no_grad():
            results.append(nn.functional.mse_loss(model(x[1536:]), y[1536:]).item())
    return results[0], results[1]


@pytest.mark.slow  # about 20 s each with the machine loaded
@pytest.mark.parametrize("average_grads,closure", [(None, False), (True, True)])
def test_adamw_dssync_matches_ddp_within_one_percent(average_grads, closure):
    # None: the default for an Adam-family optimizer= (average at the step, gradients included);
    # with step(closure) the averaging waits for the closure's backward.
    ddp, dssync = spawn(_ddp_and_dssync, 2, args=(average_grads, closure), timeout_s=120)[0]
    assert abs(dssync / ddp - 1) < 0.01, (ddp, dssync)


@pytest.mark.slow
def test_averaging_after_the_step_trails_ddp():
    # What the default replaces: each rank's own Adam step, then parameters and moments averaged.
    ddp, dssync = spawn(_ddp_and_dssync, 2, args=(False,), timeout_s=120)[0]
    assert dssync / ddp - 1 > 0.01, (ddp, dssync)


def test_on_by_default_for_adam_and_refused_without_optimizer_or_with_overlap():
    # The first AdamW a process makes costs seconds (torch imports its compiler's pieces): the
    # Adam-family checks share this one test.
    p = [nn.Parameter(torch.zeros(1))]
    opt = torch.optim.AdamW(p)
    assert is_adaptive(opt) and is_adaptive(torch.optim.Adam(p))
    assert not is_adaptive(torch.optim.SGD(p, lr=0.1)) and not is_adaptive(None)
    with pytest.raises(UsageError, match="pass optimizer="):
        Options(average_grads=True).check(None)
    with pytest.raises(UsageError, match="average_grads=False, or overlap=False"):
        Options(average_grads=True, overlap=True).check(opt)
    assert Options().check(opt).average_grads  # the default for Adam
    assert not Options(overlap=True).check(opt).average_grads  # not behind overlap
    sgd = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    assert not Options().check(sgd).average_grads  # SGD: the same either way


class _Pair:
    """A stand-in DSSync: rank 0 of a pair in a world of four; its averaging gives ``mean``,
    calling the hook at its points as DSSync does."""

    world_size, steps, every, averagings = 4, 0, 1, 0
    hook: BeforeStep

    def __init__(self, param: nn.Parameter, mean: float) -> None:
        self.param, self.mean = param, mean

    def current_group(self) -> list[int]:
        return [0, 1]

    def average_now(self) -> None:
        self.hook.on_send(Averaging(self, self.averagings, [0, 1]))
        self.hook.before_merge(self)
        self.param.grad.fill_(self.mean)
        self.hook.after_merge(self)


@pytest.mark.parametrize(
    "first,own,fed",
    [
        (1.0, 1.5, 0.875),  # g^2 - var / 4 with var = 2 * 0.5^2
        (3.0, 2.5, -0.125),  # below zero for one step: the running average stays well above
        (3.0, 5.0, None),  # the running average bounded at half its uncorrected value
    ],
)
def test_second_moment_is_fed_the_worlds_squared_gradient(first, own, fed):
    # Pair mean g = 1; this rank's own gradient estimates the per-rank variance
    # (2 * (own - g)^2); Adam's second moment is fed g^2 - var * (1/2 - 1/4), each step's input
    # unbounded, the running average at least half of what g^2 alone would make it.
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.95))
    p.grad = torch.full((1,), first)
    opt.step()  # Adam's state exists from the first step on
    v0 = opt.state[p]["exp_avg_sq"].clone()
    pair = _Pair(p, 1.0)
    pair.hook = BeforeStep(pair, opt)
    p.grad = torch.full((1,), own)
    opt.step()
    want = 0.95 * v0 + 0.05 * fed if fed is not None else (0.95 * v0 + 0.05) / 2
    torch.testing.assert_close(opt.state[p]["exp_avg_sq"], want)


def _uneven_adamw(every: int):
    from torch.distributed.algorithms.join import Join

    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    m = nn.Linear(3, 1)
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    sync = DSSync(m, Shuffle(2, seed=0), optimizer=opt, every=every, timeout_s=20)
    with Join([sync]):
        for _ in range(2 + 2 * rank):  # rank 0 runs out of data after 2 steps, rank 1 after 4
            m(torch.randn(4, 3)).pow(2).mean().backward()
            opt.step()
            sync.step()
            opt.zero_grad()
    sync.average_all()
    return sync.steps, sync.averagings, [p.detach().clone() for p in m.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("every", [1, 2])
def test_join_serves_a_group_that_averages_at_the_step(every):
    # The joined rank hears of each step before the averaging inside optimizer.step(), and sends
    # zero gradients: no rank waits for the other.
    out = spawn(_uneven_adamw, 2, args=(every,), timeout_s=120, collective_timeout_s=60)
    assert [(s, n) for s, n, _ in out] == [(4, 4 // every)] * 2
    for a, b in zip(out[0][2], out[1][2], strict=True):
        assert torch.equal(a, b)


def _moments_after_pairs(every: int) -> dict:
    """4 ranks, AdamW, Shuffle(2): three averagings (the last in the last step), then the
    global average."""
    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sync = DSSync(model, schedule=Shuffle(2, seed=0), optimizer=opt, every=every, timeout_s=60)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(rank))
    for _ in range(3 * every):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sync.step()
    moments = lambda: [s["exp_avg"].clone() for s in opt.state.values()]  # noqa: E731
    out = {"moments": moments(), "group": sync.schedule.partition(2, 4)}
    sync.average_all()
    out["all"] = moments()
    sync.close()
    return out


@pytest.mark.parametrize("every,travel", [(1, False), (2, True)])
def test_moments_stay_per_rank_when_gradients_are_averaged_every_step(every, travel):
    """At every=1 a step's averaging sends parameters and gradients, not the moments (half the
    bytes; docs/guide/adam.md): the last pair stepped on one mean gradient from moments of its
    own. With local steps the moments travel: the pair averaged them, then took the same step.
    average_all sends them either way."""
    outs = spawn(_moments_after_pairs, 4, args=(every,), timeout_s=120)
    a, b = outs[0]["group"][0]
    same = all(
        torch.equal(x, y) for x, y in zip(outs[a]["moments"], outs[b]["moments"], strict=True)
    )
    assert same == travel
    for out in outs:
        for x, y in zip(out["all"], outs[0]["all"], strict=True):
            assert torch.equal(x, y)
