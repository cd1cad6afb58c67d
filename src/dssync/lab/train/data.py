"""A rank's data: its workload's train and test sets, its shard, and the batches of each step.

The order of each epoch is a seeded permutation of the shard, a pure function of (seed, epoch,
rank), so a resumed run draws the batches it would have drawn.

Example::

    data = RankData.load(cfg, rank=0, world=2)
    batch = data.batch(step)          # the batch of 0-based ``step``
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from dssync.errors import UsageError
from dssync.lab.config import TrainConfig
from dssync.lab.workloads import Workload, get, shard


class RankData:
    """One rank's view of the workload's data; ``steps_per_epoch`` is the same on every rank."""

    def __init__(
        self, cfg: TrainConfig, wl: Workload, train: Dataset, test: Dataset, rank: int, world: int
    ) -> None:
        self.cfg, self.wl, self.train, self.test = cfg, wl, train, test
        self.rank = rank
        self.batch_size = cfg.batch_size or wl.batch_size
        self.local = shard(train, rank, world, seed=cfg.seed)
        self.steps_per_epoch = steps_per_epoch(len(train), world, self.batch_size)
        self._epoch: int | None = None
        self._batches: Any = None

    @classmethod
    def load(cls, cfg: TrainConfig, rank: int, world: int) -> RankData:
        wl = workload(cfg)
        train, test = load_datasets(wl, cfg)
        return cls(cfg, wl, train, test, rank, world)

    def total_steps(self) -> int:
        """Steps of the whole run: ``epochs`` epochs, or ``max_steps`` if that is fewer."""
        total = self.steps_per_epoch * self.cfg.epochs
        return total if self.cfg.max_steps is None else min(self.cfg.max_steps, total)

    def batch(self, step: int) -> Any:
        """The batch of 0-based ``step`` (steps must come in order, from any start)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        if self._epoch != epoch or self._batches is None:
            seed = self.cfg.seed * 7919 + epoch * 31 + self.rank
            order = epoch_batches(len(self.local), self.batch_size, self.steps_per_epoch, i, seed)
            self._batches, self._epoch = iter(DataLoader(self.local, batch_sampler=order)), epoch
        return next(self._batches)

    def sample(self) -> Any:
        """The first batch of this rank's shard, in order; :meth:`batch` goes on unaffected."""
        return next(iter(DataLoader(self.local, batch_size=self.batch_size)))

    def epoch(self, step: int) -> int:
        return step // self.steps_per_epoch


def planned_steps(cfg: TrainConfig, world: int) -> int:
    """How many steps a run of ``cfg`` on ``world`` ranks takes (loads the data set's size)."""
    wl = workload(cfg)
    train, _ = load_datasets(wl, cfg)
    total = steps_per_epoch(len(train), world, cfg.batch_size or wl.batch_size) * cfg.epochs
    return total if cfg.max_steps is None else min(cfg.max_steps, total)


def workload(cfg: TrainConfig) -> Workload:
    """The workload ``cfg`` names, with ``cfg.lr`` as its rate when given."""
    try:
        wl = get(cfg.workload, data_dir=cfg.data_dir, **cfg.workload_options)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if cfg.lr is not None:
        wl.lr = cfg.lr
    return wl


def load_datasets(wl: Workload, cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """The workload's (train, test) sets; data in --data-dir that cannot be read is the user's error."""
    try:
        return wl.datasets()
    except Exception as e:  # noqa: BLE001 - unreadable files surface as any unpickling/parsing error
        if cfg.data_dir is None:
            raise
        if isinstance(e, ValueError | OSError):
            raise UsageError(str(e)) from e  # the workloads' own messages name the file and the fix
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UsageError(
            f"cannot read the {cfg.workload} data in --data-dir {cfg.data_dir} ({type(e).__name__}: {first}); "
            f"pass a folder in the format `dssync train --workload {cfg.workload}` expects (see --help)"
        ) from e


def steps_per_epoch(n_train: int, world_size: int, batch_size: int) -> int:
    """Batches per epoch, the same on every rank (shards differ in size by at most one)."""
    steps = (n_train // world_size) // batch_size
    if steps < 1:
        raise UsageError(
            f"{n_train} training samples over {world_size} workers give no full batch of "
            f"{batch_size}; use a smaller --batch-size or fewer --workers"
        )
    return steps


def epoch_batches(n: int, batch: int, n_steps: int, start: int, seed: int) -> list[list[int]]:
    """Batches ``start`` .. ``n_steps - 1`` of one epoch: a seeded permutation of ``n`` samples, cut.

    The order is a pure function of ``seed``, so a resumed run draws the batches it would have.
    """
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[j * batch : (j + 1) * batch] for j in range(start, n_steps)]
