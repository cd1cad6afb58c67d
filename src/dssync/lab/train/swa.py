"""The extended SWA ensemble: each worker averages its own weights over the final phase of
training, the final model averages those running means across all workers, then batch-norm
statistics are re-estimated for the combined weights.

PyTorch's ``torch.optim.swa_utils`` does the per-worker pieces: :class:`WeightAverage` is an
``AveragedModel`` (equal-weight running mean of the parameters) and :func:`recompute_batch_norm`
is ``update_bn``. What stays here is only what they cannot know about: the average across workers
(:func:`dssync.lab.train.summary.averaged_copy`) and feeding each workload's batches.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, update_bn


class WeightAverage(AveragedModel):
    """Running mean of a module's parameters over the steps it is given (buffers as at the start).

    Example::

        swa = WeightAverage(model)
        for step in range(100):
            train_one_step()
            if step >= 75:
                swa.update(model)
        final = swa.module
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)

    @property
    def count(self) -> int:
        """How many models have been averaged."""
        return int(self.n_averaged)

    def update(self, module: nn.Module) -> None:
        self.update_parameters(module)


def recompute_batch_norm(
    module: nn.Module, batches: Iterable, device: torch.device | None = None
) -> None:
    """Re-estimate batch-norm running statistics with a cumulative mean over ``batches``.

    Each batch is a tensor or a tuple whose first element is the model's input.
    """
    update_bn(batches, module, device=device)
