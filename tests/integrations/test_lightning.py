"""A real lightning.Trainer with DSSyncStrategy on 2 CPU processes: fit, checkpoint, resume."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dssync import Schedule, nesterov
from dssync.errors import UsageError
from dssync.lab.launch import spawn
from dssync.lightning import DSSyncStrategy

STEPS_PER_EPOCH = 5  # odd, so a resume at the wrong schedule step lands on the other partition


class Alternate(Schedule):
    """Even steps: every rank alone (no averaging); odd steps: all ranks in one group."""

    def partition(self, step: int, world_size: int) -> list[list[int]]:
        if step % 2 == 0:
            return [[r] for r in range(world_size)]
        return [list(range(world_size))]


class Tiny(L.LightningModule):
    """Linear regression that records its gradient before and its weight after each step."""

    def __init__(self, accumulate: int = 1) -> None:
        super().__init__()
        self.accumulate = accumulate
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)
        self.grads: list[torch.Tensor] = []
        self.weights: list[torch.Tensor] = []
        self.sync_steps = -1

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def on_before_optimizer_step(self, optimizer) -> None:
        self.grads.append(self.net.weight.grad.detach().clone())

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self.accumulate == 0:  # a batch that ended with an optimizer step
            self.weights.append(self.net.weight.detach().clone())

    def on_train_end(self) -> None:
        self.sync_steps = self.trainer.strategy.sync.steps


def _loader(accumulate: int = 1) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2 * 4 * STEPS_PER_EPOCH * accumulate, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(len(x), 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)


def _trainer(root: Path, epochs: int, strategy: DSSyncStrategy, callbacks=(), **kw) -> L.Trainer:
    return L.Trainer(
        **kw,
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
    )


def _fit(root: str):
    """One epoch of 5 optimizer steps over 2 accumulated batches each, in bf16 autocast."""
    model = Tiny(accumulate=2)
    trainer = _trainer(
        Path(root),
        1,
        DSSyncStrategy(Alternate()),
        accumulate_grad_batches=2,
        precision="bf16-mixed",
    )
    trainer.fit(model, _loader(accumulate=2))
    trainer.save_checkpoint(Path(root) / "final.ckpt")  # after fit: still carries the step
    saved = torch.load(Path(root) / "final.ckpt", weights_only=False)["dssync"]["steps"]
    return model.grads, model.weights, model.net.weight.detach(), model.sync_steps, saved


def _fit_resume(root: str):
    root = Path(root)

    def strategy() -> DSSyncStrategy:
        return DSSyncStrategy(Alternate(), average_optimizer_state=True)

    def saver(name: str) -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=root / name, save_top_k=-1, every_n_epochs=1)

    straight = Tiny()
    _trainer(root, 2, strategy(), [saver("straight")]).fit(straight, _loader())
    ckpt = root / "straight" / f"epoch=0-step={STEPS_PER_EPOCH}.ckpt"
    resumed = Tiny()
    _trainer(root, 2, strategy(), [saver("resumed")]).fit(resumed, _loader(), ckpt_path=ckpt)
    saved = torch.load(ckpt, weights_only=False)
    return (
        straight.net.weight.detach(),
        resumed.net.weight.detach(),
        resumed.sync_steps,
        saved["dssync"],
        saved["state_dict"]["net.weight"],
    )


def test_name_dssync_selects_the_strategy():
    trainer = L.Trainer(strategy="dssync", accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, DSSyncStrategy)


def test_bad_settings_name_the_fix():
    with pytest.raises(UsageError, match="dssync.Shuffle"):
        DSSyncStrategy("pairs")
    with pytest.raises(UsageError, match="find_unused_parameters"):
        DSSyncStrategy(find_unused_parameters=True)
    with pytest.raises(UsageError, match="model_averaging_period"):
        DSSyncStrategy(model_averaging_period=4)
    assert DSSyncStrategy(process_group_backend="gloo").process_group_backend == "gloo"


@pytest.mark.timeout(240)
def test_fit_keeps_gradients_local_and_averages_after_each_update(tmp_path):
    (g0, w0, end0, steps0, saved), (g1, w1, end1, steps1, _) = spawn(
        _fit, 2, args=(str(tmp_path),), timeout_s=200
    )
    assert saved == steps0 == steps1 == len(g0) == len(w0) == STEPS_PER_EPOCH  # 1 per update
    for step in range(STEPS_PER_EPOCH):
        assert not torch.equal(g0[step], g1[step]), f"step {step}: gradients were all-reduced"
        paired = step % 2 == 1
        assert torch.equal(w0[step], w1[step]) == paired, f"step {step}: paired={paired}"
    assert not torch.equal(w0[-1], w1[-1])  # the last step trained alone ...
    assert torch.equal(end0, end1)  # ... and fit still ends with one model
    assert torch.allclose(end0, (w0[-1] + w1[-1]) / 2)


@pytest.mark.timeout(300)
def test_checkpoint_resume_continues_on_the_same_partitions(tmp_path):
    (straight, resumed, steps, saved, weight), _ = spawn(
        _fit_resume, 2, args=(str(tmp_path),), timeout_s=260
    )
    assert saved["steps"] == STEPS_PER_EPOCH and "Alternate" in saved["schedule"]
    assert not torch.equal(weight, straight)  # training went on after the checkpoint
    torch.testing.assert_close(resumed, straight, rtol=0, atol=0)
    assert steps == 2 * STEPS_PER_EPOCH


def _fit_every(root: str):
    """One epoch of 5 steps, averaging every 2nd: Alternate's averaging 0 alone, 1 together."""
    model = Tiny()
    strategy = DSSyncStrategy(Alternate(), every=2, outer=nesterov(lr=1.0, momentum=0.0))
    _trainer(Path(root), 1, strategy).fit(model, _loader())
    return model.weights


@pytest.mark.timeout(240)
def test_the_options_reach_dssync_every_and_outer(tmp_path):
    w0, w1 = spawn(_fit_every, 2, args=(str(tmp_path),), timeout_s=200)
    assert len(w0) == STEPS_PER_EPOCH
    # Step 4 is averaging 1 (all ranks); the outer step at rate 1 leaves the mean up to rounding.
    together = [torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(w0, w1, strict=True)]
    assert together == [False, False, False, True, False]


def _refuse_sharded() -> str | None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    module = Tiny()
    fully_shard(module, mesh=init_device_mesh("cpu", (2,)))  # as a configure_model could
    strategy = DSSyncStrategy()
    strategy.connect(module)
    try:
        strategy.setup(None)  # refused before it looks at the trainer
    except UsageError as exc:
        return str(exc)
    return None


@pytest.mark.timeout(120)
def test_a_sharded_module_is_refused_naming_dssync_across_replicas():
    for message in spawn(_refuse_sharded, 2, timeout_s=100):
        assert message is not None, "DSSyncStrategy took a sharded module"
        assert "DSSyncStrategy does not support a sharded (DTensor, FSDP2) model" in message
        assert "process_group=mesh.get_group('replicate')" in message
