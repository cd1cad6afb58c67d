"""A resumed --sync auto run keeps the pick its checkpoints record instead of choosing again."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dssync.launch import WorkerError
from dssync.train import TrainConfig, run_training


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_resumed_auto_run_keeps_the_pick_of_its_checkpoint(tmp_path):
    cfg = TrainConfig(
        workload="digits",
        sync="auto",
        epochs=1,
        max_steps=6,
        progress=False,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=3,
        outer="none",  # what a fresh choice would not pick for a local-step method
        every=8,
    )
    first = run_training(cfg, workers=2)["auto"]
    assert first["kept_from"] is None
    assert (first["every"], first["outer"]) == (8, "none"), first  # a local-step pick
    # Resumed without the options: choosing again would give the rule's every and outer step.
    resumed = run_training(replace(cfg, every=None, outer=None, max_steps=9, resume=True), 2)
    assert resumed["resumed_from"] == 6
    kept = resumed["auto"]
    assert kept["kept_from"] == 6
    assert {k: kept[k] for k in ("method", "every", "outer", "reason", "compute_s")} == {
        k: first[k] for k in ("method", "every", "outer", "reason", "compute_s")
    }
    with pytest.raises(WorkerError, match="would change"):  # --every against the kept pick
        run_training(replace(cfg, every=4, outer=None, max_steps=12, resume=True), 2)
