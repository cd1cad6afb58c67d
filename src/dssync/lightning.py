"""Lightning: ``Trainer(strategy="dssync")`` trains with DS-Sync in place of DDP's gradient all-reduce.

Importing this module registers :class:`DSSyncStrategy` under the name ``"dssync"``. Each rank steps
on its own gradients; after every optimizer step :class:`dssync.DSSync` averages the parameters
(and floating buffers, and optionally the optimizer state) inside that step's group. Every
checkpoint save and the end of ``fit`` average over all ranks, so what is saved, tested or
predicted is one model, and a checkpoint carries the schedule step so ``ckpt_path=`` resumes on
the same partitions. Needs ``pip install 'dssync[lightning]'``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.optim import Optimizer

from dssync import DSSync, Schedule
from dssync.errors import UsageError
from dssync.strategies.options import Options, options_of
from dssync.strategies.sharded import refuse_in_door


class DSSyncStrategy(DDPStrategy):
    """DDP's process handling and data sharding, with DS-Sync's group averaging instead of DDP.

    The module is not wrapped in ``DistributedDataParallel``: gradients stay on their rank.

    Args:
        schedule: which ranks average together at each averaging (default: :class:`DSSync`'s).
        average_optimizer_state: also average the optimizer's floating state (momentum, Adam
            moments; after an Adam-family optimizer averaging every step, only at
            ``average_all``: docs/guide/adam.md); needs exactly one optimizer. Checkpoints then
            resume every rank exactly.
        options: a :class:`dssync.Options` (default: all defaults).
        **kwargs: any field of :class:`dssync.Options`, the same names and meaning as
            ``DSSync``'s (``every=4, outer=dssync.nesterov()``: DiLoCo in the groups;
            ``wire="int8"``: compressed exchanges), and DDPStrategy's own settings
            (``process_group_backend``, ``timeout``, ``start_method``, ...);
            DistributedDataParallel's options are refused.

    Example (``python train.py`` starts both ranks)::

        import lightning as L
        import dssync.lightning  # registers strategy="dssync"
        trainer = L.Trainer(strategy="dssync", accelerator="cpu", devices=2, max_epochs=1)
        trainer.fit(model, loader)

        # or with settings:
        from dssync import Shuffle
        from dssync.lightning import DSSyncStrategy
        trainer = L.Trainer(strategy=DSSyncStrategy(Shuffle(4, seed=1)), devices=8)
        trainer = L.Trainer(strategy=DSSyncStrategy(every=4, outer=dssync.nesterov()), devices=8)
    """

    name = "dssync"

    def __init__(
        self,
        schedule: Schedule | None = None,
        average_optimizer_state: bool = False,
        *,
        options: Options | None = None,
        **kwargs: Any,
    ) -> None:
        if schedule is not None and not isinstance(schedule, Schedule):
            raise UsageError(
                f"schedule={schedule!r} is not a dssync schedule; "
                "pass one such as dssync.Shuffle(2, seed=0)"
            )
        settings, kwargs = Options.split(kwargs)
        self.options = options_of(options, settings)
        super().__init__(**kwargs)
        given = sorted(
            k for k, v in kwargs.items() if k not in _DDP_STRATEGY_ARGS and v is not None
        )
        if given:
            raise UsageError(
                f"DSSyncStrategy has no DistributedDataParallel wrapper, so these DDP options do "
                f"nothing: {', '.join(given)}; drop them, or use DDPStrategy"
            )
        self.schedule = schedule
        self.average_optimizer_state = average_optimizer_state
        self.sync: DSSync | None = None
        self._state: dict[str, Any] | None = None  # the last fit's DS-Sync state
        self._resume: dict[str, Any] | None = None

    def configure_ddp(self) -> None:
        """Leave the module unwrapped: no gradient all-reduce."""

    def setup(self, trainer: pl.Trainer) -> None:
        refuse_in_door(self.lightning_module, "DSSyncStrategy")
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        optimizer = None
        if self.average_optimizer_state:
            if len(self.optimizers) != 1:
                raise UsageError(
                    f"average_optimizer_state=True needs one optimizer, the module has "
                    f"{len(self.optimizers)}; return one from configure_optimizers or "
                    "set average_optimizer_state=False"
                )
            optimizer = self.optimizers[0]
        timeout_s = self._timeout.total_seconds() if self._timeout else None
        self.sync = DSSync(
            self.lightning_module,
            schedule=self.schedule,
            optimizer=optimizer,
            options=self.options
            if timeout_s is None
            else self.options.replace(timeout_s=timeout_s),
        )
        if self._resume is not None:
            if "dssync" in self._resume:
                self.sync.load_state_dict(self._resume["dssync"])
            else:
                rank_zero_warn(
                    "the checkpoint has no DS-Sync state; the schedule resumes at its global_step"
                )
                self.sync.steps = int(self._resume.get("global_step", 0))
                self.sync.averagings = self.sync.steps // self.sync.every

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: pl.LightningModule | None = None,
        **kwargs: Any,
    ) -> Any:
        """The optimizer step on local gradients, then the average inside this step's group."""
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.sync is not None:
            self.sync.step()
        return output

    def lightning_module_state_dict(self) -> dict[str, Any]:
        # Every rank calls this while a checkpoint is written: save (and go on from) the average.
        if self.sync is not None:
            self.sync.average_all()
        return super().lightning_module_state_dict()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        if self.sync is not None:
            self._state = self.sync.state_dict()
        if self._state is not None:  # also after fit, e.g. trainer.save_checkpoint("final.ckpt")
            checkpoint["dssync"] = self._state
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._resume = {k: checkpoint[k] for k in ("dssync", "global_step") if k in checkpoint}
        return checkpoint

    def on_train_end(self) -> None:
        """One global average, so the model that ``fit`` leaves is the same on every rank."""
        if self.sync is not None:
            self.sync.average_all()

    def teardown(self) -> None:
        if self.sync is not None:
            self._state = self.sync.state_dict()
        self.sync = None
        self._resume = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        if cls.name not in strategy_registry:
            strategy_registry.register(
                cls.name, cls, description="DS-Sync group averaging (dssync)"
            )


_DDP_STRATEGY_ARGS = {
    "accelerator",
    "parallel_devices",
    "cluster_environment",
    "checkpoint_io",
    "precision_plugin",
    "process_group_backend",
    "timeout",
    "start_method",
}

DSSyncStrategy.register_strategies(StrategyRegistry)
