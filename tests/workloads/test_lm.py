"""The `lm` workload: a byte-level transformer on CPython's sources, AdamW, clipping, learning."""

from __future__ import annotations

import math

import torch
from torch.utils.data import Subset
from workload_helpers import first_batch, train_steps

from dssync.lab.workloads import get
from dssync.lab.workloads.lm import CLIP


def test_lm_learns_bytes_and_reports_validation_loss():
    wl = get("lm")
    assert (wl.metric_name, wl.higher_is_better, wl.lr_schedule) == ("loss", False, "warmup-cosine")
    train, val = wl.datasets()
    x, y = train.tensors
    assert x.shape[1] == 64 and x.dtype == torch.long and int(x.max()) < 256
    assert torch.equal(x[0, 1:], y[0, :-1])  # the target is the next byte
    assert len(train) > 5 * len(val) > 0
    losses = train_steps(wl, first_batch(wl, 16), steps=30)
    assert math.log(256) * 0.9 < losses[0] < math.log(256) * 1.2  # starts near uniform
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.6 * losses[0]
    loss = wl.evaluate(wl.model(), Subset(val, range(64)))["loss"]
    assert math.isfinite(loss)


def test_lm_optimizer_is_adamw_and_clips_at_one():
    wl = get("lm", d_model=32)
    model = wl.model()
    opt = wl.optimizer(model.parameters())
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["weight_decay"] == 0.1
    for p in model.parameters():
        p.grad = torch.full_like(p, 10.0)
    seen = []
    opt.register_step_pre_hook(
        lambda o, a, k: seen.append(
            torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        )
    )
    opt.step()
    assert abs(float(seen[0]) - CLIP) < 1e-4


def test_dssync_train_runs_the_lm_workload_with_adamw_averaged_at_the_step():
    from dssync.lab.train import TrainConfig, run_training

    cfg = TrainConfig(
        workload="lm", sync="dssync", average_momentum=True, max_steps=6, progress=False
    )
    s = run_training(cfg, workers=2)
    assert s["steps"] == 6 and s["metric_name"] == "loss"
    assert math.isfinite(s["final_metric"]) and s["final_metric"] < math.log(256)
