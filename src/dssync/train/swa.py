"""The extended SWA ensemble: each worker averages its own weights over the final phase of
training, the final model averages those running means across all workers, then batch-norm
statistics are re-estimated for the combined weights."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

import torch
from torch import nn


class WeightAverage:
    """Running mean of a module's parameters over the steps it is given.

    Example::

        swa = WeightAverage(model)
        for step in range(100):
            train_one_step()
            if step >= 75:
                swa.update(model)
        final = swa.module
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = copy.deepcopy(module)
        self.count = 0

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        self.count += 1
        for avg, p in zip(self.module.parameters(), module.parameters(), strict=True):
            avg.add_(p.detach() - avg, alpha=1.0 / self.count)


def has_batch_norm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


@torch.no_grad()
def recompute_batch_norm(module: nn.Module, batches: Iterable, forward: Callable[[nn.Module, object], object]) -> None:
    """Re-estimate batch-norm running statistics with a cumulative mean over ``batches``."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    was_training = module.training
    module.train()
    for b in batches:
        forward(module, b)
    module.train(was_training)
    for m, mom in zip(norms, saved, strict=True):
        m.momentum = mom
