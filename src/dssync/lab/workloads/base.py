"""What a workload is: a model, its data, its loss and its metric.

A workload is everything the training loop needs that is not synchronization. Each one is a
small class in its own module; :func:`dssync.lab.workloads.get` builds one by name.

Example::

    from dssync.lab.workloads import get
    wl = get("mnist")
    model = wl.model()
    train, test = wl.datasets()
    loss = wl.loss(model, next(iter(wl.loader(train, batch_size=32))))
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

Batch = tuple[torch.Tensor, ...]


class Workload(ABC):
    """A model, a data set split into train and test, a loss, a metric and an optimizer.

    Subclasses set the class attributes and implement the four abstract methods. Batches are
    tuples of tensors (what a ``TensorDataset`` yields).
    """

    name: str = ""
    metric_name: str = "accuracy"
    higher_is_better: bool = True
    # The defaults of `dssync train` and `dssync compare`: settings that reach a converged,
    # comparable result in minutes on a 2-core CPU (README, "Measured here").
    epochs: int = 3
    batch_size: int = 32
    lr: float = 0.05
    lr_schedule: str = "constant"  # see dssync.lab.train.lr
    # The quality a run must reach, the finish line of `dssync compare`'s time to train (as
    # MLPerf Training's targets): a value BSP reaches on every seed well before the end of the
    # default run on 8 workers, so every method has room to reach it. None: not declared.
    target: float | None = None

    def __init__(self, data_dir: str | None = None, **options: Any) -> None:
        self.data_dir = data_dir
        self.options = options

    @abstractmethod
    def model(self) -> nn.Module:
        """A freshly initialised model (callers seed torch before calling)."""

    @abstractmethod
    def datasets(self) -> tuple[Dataset, Dataset]:
        """(train, test) data sets; the same on every rank."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Scalar training loss of ``model`` on ``batch``."""

    @abstractmethod
    def evaluate(self, model: nn.Module, data: Dataset) -> dict[str, float]:
        """Metrics on ``data``; must contain ``self.metric_name`` and ``"loss"``."""

    def quality_target(self) -> float | None:
        """The target for these options (a workload whose options change the model may vary it)."""
        return self.target

    def default_epochs(self) -> int:
        """The run's length for these options: long enough for BSP to reach the target."""
        return self.epochs

    def optimizer(self, params) -> torch.optim.Optimizer:
        """The optimizer this workload trains with (SGD with momentum unless overridden)."""
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9, weight_decay=1e-4)

    def loader(
        self, data: Dataset, batch_size: int | None = None, shuffle: bool = False, seed: int = 0
    ) -> DataLoader:
        gen = torch.Generator().manual_seed(seed)
        return DataLoader(
            data,
            batch_size=batch_size or self.batch_size,
            shuffle=shuffle,
            generator=gen,
            drop_last=shuffle,
        )


def shard(data: Dataset, rank: int, world_size: int, seed: int = 0) -> Dataset:
    """This rank's disjoint shard of ``data`` (a seeded permutation, then every world_size-th)."""
    order = np.random.default_rng(seed).permutation(len(data))
    return Subset(data, order[rank::world_size].tolist())


@torch.no_grad()
def classification_eval(model: nn.Module, data: Dataset, batch_size: int = 512) -> dict[str, float]:
    """Accuracy and mean cross-entropy of a classifier on a data set of (x, y) pairs."""
    was_training = model.training
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for x, y in DataLoader(data, batch_size=batch_size):
        out = model(x)
        loss_sum += nn.functional.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
        total += len(y)
    model.train(was_training)
    return {"accuracy": correct / max(total, 1), "loss": loss_sum / max(total, 1)}


def tensor_split(
    x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int = 0
) -> tuple[TensorDataset, TensorDataset]:
    """A seeded train/test split of arrays into two TensorDatasets."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    return TensorDataset(xt[train], yt[train]), TensorDataset(xt[test], yt[test])
