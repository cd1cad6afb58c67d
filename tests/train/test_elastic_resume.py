"""A run checkpointed by N workers resumes with M: every rank starts from the mean of the saved
models, the step and the rate schedule continue, and the resumed run keeps its accuracy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dssync.lab.train import StepHook, TrainConfig, run_training
from dssync.lab.train.checkpoint import checkpoint_path, read_checkpoint
from dssync.lab.workloads import get


class StartProbe(StepHook):
    """Saves each rank's model as it is when training (re)starts."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def started(self, rank: int, strategy) -> None:
        state = {k: v.detach().cpu().clone() for k, v in strategy.module.state_dict().items()}
        torch.save(state, Path(self.folder, f"start{rank}.pt"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("before", "after", "epochs"), [(4, 2, 2), (2, 4, 3)])
def test_resume_with_another_number_of_workers(tmp_path, before, after, epochs):
    ckpt = tmp_path / "ckpt"
    base = TrainConfig(
        workload="digits", epochs=1, progress=False, timeout_s=60, checkpoint_dir=str(ckpt)
    )
    first = run_training(base, workers=before)
    step = first["steps"]
    saved = [read_checkpoint(checkpoint_path(ckpt, r, step))[1] for r in range(before)]
    if before == 4:  # two pairs that differ: the mean is not any one saved model
        assert len({str(s["model"]) for s in saved}) > 1

    resumed = run_training(
        replace(base, epochs=epochs, resume=True), workers=after, hook=StartProbe(str(tmp_path))
    )
    assert resumed["resumed_from"] == step and resumed["world_size"] == after
    n_train = len(get("digits").datasets()[0])
    total = n_train // after // get("digits").batch_size * epochs
    assert resumed["steps"] == total > step
    assert [e["step"] for e in resumed["log"] if e["step"] > step] == list(
        range(step + 1, total + 1)
    )
    rates = [e["lr"] for e in resumed["log"]]
    assert rates and all(r == rates[0] for r in rates)  # digits: constant rate, continued

    for rank in range(after):
        start = torch.load(tmp_path / f"start{rank}.pt", weights_only=True)
        for name, value in start.items():
            if value.is_floating_point():
                mean = (
                    torch.stack([s["model"][name].double() for s in saved]).mean(0).to(value.dtype)
                )
                torch.testing.assert_close(value, mean, msg=f"rank {rank} {name}")
    assert resumed["final_accuracy"] >= 0.9
    assert resumed["final_accuracy"] >= first["final_accuracy"] - 0.02
