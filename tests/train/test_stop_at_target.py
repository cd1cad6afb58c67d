"""--stop-at-target: a run ends at its first evaluation at the target, as MLPerf Training's do."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dssync.lab.train import TrainConfig, run_training


@pytest.mark.timeout(300)
def test_a_run_stops_at_its_first_evaluation_at_the_target():
    base = TrainConfig(
        workload="digits", sync="dssync", epochs=2, eval_every=3, progress=False, timeout_s=60
    )
    full = run_training(base, workers=2)
    accs = [e["accuracy"] for e in full["evals"]]
    target = accs[2] - 1e-9  # reached at the third evaluation at the latest
    first = next(i for i, a in enumerate(accs) if a >= target)
    assert first < len(accs) - 1, accs  # so the stopped run is shorter than the full one
    stopped = run_training(replace(base, stop_at=target), workers=2)
    assert stopped["steps"] == full["evals"][first]["step"] < full["steps"]
    assert [e["accuracy"] for e in stopped["evals"]] == accs[: first + 1]  # same run, cut short
    # Each evaluation also says when the global average it evaluated was done on every rank.
    assert all(e["averaged_time_s"] > e["time_s"] >= e["rank_time_s"] for e in full["evals"])
