"""The language model's plain training loop, shared by tools/lm_parity.py,
tools/lm_sharded_parity.py and the sharded race (:mod:`dssync.lab.bench.sharded_race`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from dssync.lab.train.lr import LRSchedule
from dssync.lab.workloads.lm import LM


def batches(
    data, steps: int, batch_size: int, seed: int, rank: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's (input, target) batch of ``rank`` from its shard ``data``: the shard
    reshuffled on every pass, seeded by ``(seed, rank)``, as the lm parity runs draw them."""
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    passes = steps * batch_size // len(data) + 1
    order = torch.cat([torch.randperm(len(data), generator=gen) for _ in range(passes)])
    for step in range(steps):
        idx = order[step * batch_size : (step + 1) * batch_size].tolist()
        x, y = (torch.stack(t) for t in zip(*(data[i] for i in idx), strict=True))
        yield x, y


def train_steps(
    workload: LM,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sync,
    data,
    steps: int,
    seed: int,
    rank: int,
    forward: nn.Module | None = None,
    take: int | None = None,
    after: Callable[[int], object] | None = None,
) -> None:
    """The lm runs' loop (tools/lm_parity.py, tools/lm_sharded_parity.py, the sharded race):
    each step sets the learning rate (warm-up and cosine over ``steps``), runs forward and
    backward through ``forward`` (``model`` if None) on the first ``take`` rows of the batch,
    ``optimizer.step()``, ``sync.step()`` (unless ``sync`` is None) and ``zero_grad``; then
    ``after(step)``."""
    rates = LRSchedule(optimizer, workload.lr_schedule, steps)
    for step, (x, y) in enumerate(batches(data, steps, workload.batch_size, seed, rank)):
        rates.apply(step)
        workload.loss(model if forward is None else forward, (x[:take], y[:take])).backward()
        optimizer.step()
        if sync is not None:
            sync.step()
        optimizer.zero_grad(set_to_none=True)
        if after is not None:
            after(step)
