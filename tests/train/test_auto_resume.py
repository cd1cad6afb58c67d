"""A resumed --sync auto run keeps the pick its checkpoints record instead of choosing again."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dssync.lab.launch import WorkerError
from dssync.lab.train import TrainConfig, run_training


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
        group_size=2,
    )
    first = run_training(cfg, workers=2)["auto"]
    assert first["kept_from"] is None
    assert (first["every"], first["outer"], first["group_size"]) == (8, "none", 2), first
    # Resumed without the options: choosing again would give the rule's every and outer step.
    again = replace(cfg, every=None, outer=None, group_size=None, resume=True)
    resumed = run_training(replace(again, max_steps=9), 2)
    assert resumed["resumed_from"] == 6
    kept = resumed["auto"]
    assert kept["kept_from"] == 6
    same = ("method", "every", "outer", "group_size", "wire", "reason", "compute_s")
    assert {k: kept[k] for k in same} == {k: first[k] for k in same}
    with pytest.raises(WorkerError, match="would change"):  # --every against the kept pick
        run_training(replace(again, every=4, max_steps=12), 2)
    with pytest.raises(WorkerError, match="--group-size 1 .the checkpoints' run used 2"):
        run_training(replace(again, group_size=1, max_steps=12), 2)
    with pytest.raises(
        WorkerError, match="--wire int8 .the checkpoints' run used its method's own, fp32"
    ):
        run_training(replace(again, wire="int8", max_steps=12), 2)
