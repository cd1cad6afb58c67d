"""Helpers shared by the workload tests."""

from __future__ import annotations

import torch

from dssync.lab.workloads import Workload


def train_steps(wl: Workload, batch, steps: int = 20, seed: int = 0) -> list[float]:
    """Losses of ``steps`` optimizer steps on one fixed batch, from a seeded fresh model."""
    torch.manual_seed(seed)
    model = wl.model()
    opt = wl.optimizer(model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = wl.loss(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def first_batch(wl: Workload, size: int):
    train, _ = wl.datasets()
    return next(iter(wl.loader(train, batch_size=size)))
