"""Several runs in one start of the local worker processes, as `dssync compare` makes them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dssync.lab.experiments.runners import Runner
from dssync.lab.launch import WorkerError
from dssync.lab.train import TrainConfig

BASE = TrainConfig(workload="digits", sync="bsp", epochs=1, max_steps=4, progress=False)


def test_runs_made_in_one_start_are_the_runs_fresh_processes_make():
    cfgs = [BASE, replace(BASE, sync="dssync", seed=1), BASE]
    seen = []
    Runner(workers=2).run_all(cfgs, lambda i, summary: seen.append((i, summary)))
    assert [i for i, _ in seen] == [0, 1, 2]
    (_, first), (_, other), (_, again) = seen
    assert (first["sync"], other["sync"], again["steps"]) == ("bsp", "dssync", 4)
    assert [e["loss"] for e in again["log"]] == [e["loss"] for e in first["log"]]
    assert again["final_model_sha256"] == first["final_model_sha256"]
    alone = []
    Runner(workers=2).run_all([BASE], lambda i, summary: alone.append(summary))
    assert alone[0]["final_model_sha256"] == first["final_model_sha256"]  # a fresh process's


def test_a_run_that_fails_ends_the_start_after_reporting_the_runs_before_it():
    seen = []
    with pytest.raises(WorkerError, match="nosuch"):
        Runner(workers=2).run_all(
            [BASE, replace(BASE, workload="nosuch"), BASE], lambda i, s: seen.append(i)
        )
    assert seen == [0]
