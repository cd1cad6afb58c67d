"""Learning-rate schedules: pure factors of the step, applied to every parameter group."""

from __future__ import annotations

import math

import pytest
import torch

from dssync.lab.train import TrainConfig, run_training
from dssync.lab.train.lr import LRSchedule, lr_factor


def test_cosine_decays_from_one_to_zero():
    total = 100
    factors = [lr_factor("cosine", s, total) for s in range(total + 1)]
    assert factors[0] == 1.0
    assert factors[50] == pytest.approx(0.5)
    assert factors[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a > b for a, b in zip(factors[:-1], factors[1:], strict=True))  # strictly decreasing
    assert lr_factor("cosine", 10 * total, total) == pytest.approx(
        0.0, abs=1e-12
    )  # no rise after the end
    assert {lr_factor("constant", s, total) for s in range(total)} == {1.0}


def test_unknown_schedule_names_the_choices():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(
        ValueError,
        match="unknown learning-rate schedule 'linear'; choose from constant, cosine, warmup-cosine",
    ):
        LRSchedule(opt, "linear", 10)


def test_every_group_keeps_its_own_base_rate():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.02}])
    sched = LRSchedule(opt, "cosine", total=4)
    sched.apply(2)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.01])
    sched.apply(0)  # a resumed run going back to an earlier step gets that step's rate
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.02])


def test_training_follows_the_schedule():
    cfg = TrainConfig(
        workload="digits",
        sync="dssync",
        epochs=1,
        max_steps=6,
        lr=0.2,
        lr_schedule="cosine",
        progress=False,
        timeout_s=60,
    )
    summary = run_training(cfg, workers=2)
    rates = [row["lr"] for row in summary["log"]]
    assert rates == pytest.approx([0.2 * 0.5 * (1 + math.cos(math.pi * s / 6)) for s in range(6)])


def test_hold_sets_every_group_to_the_swa_rate():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.02}])
    sched = LRSchedule(opt, "cosine", total=8, hold_from=6, hold_lr=0.03)
    sched.apply(5)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx(
        [0.1 * lr_factor("cosine", 5, 8), 0.02 * lr_factor("cosine", 5, 8)]
    )
    for step in (6, 7):
        sched.apply(step)
        assert [g["lr"] for g in opt.param_groups] == [0.03, 0.03]
    with pytest.raises(ValueError, match="give both or neither"):
        LRSchedule(opt, "cosine", total=8, hold_from=6)


def test_swa_lr_needs_swa_start():
    from dssync.lab.train.validate import validate

    with pytest.raises(ValueError, match="add --swa-start FRACTION"):
        validate(TrainConfig(workload="digits", swa_lr=0.01), workers=2)


def test_training_holds_the_rate_while_averaging_weights():
    cfg = TrainConfig(
        workload="digits",
        sync="dssync",
        epochs=1,
        max_steps=8,
        lr=0.2,
        lr_schedule="cosine",
        swa_start=0.5,
        swa_lr=0.05,
        progress=False,
        timeout_s=60,
    )
    summary = run_training(cfg, workers=2)
    rates = [row["lr"] for row in summary["log"]]
    assert rates[:4] == pytest.approx([0.2 * lr_factor("cosine", s, 8) for s in range(4)])
    assert rates[4:] == [0.05] * 4
    assert summary["swa_metric"] is not None


def test_warmup_cosine_rises_then_decays():
    total = 100
    factors = [lr_factor("warmup-cosine", s, total) for s in range(total + 1)]
    assert factors[0] == pytest.approx(0.1)  # warm-up: 10 steps, step 0 at a tenth
    assert factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0)  # then the cosine from its top
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))
    assert factors[total] == pytest.approx(0.0, abs=1e-12)
