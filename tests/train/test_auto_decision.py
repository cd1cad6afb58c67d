"""--sync auto in a run: every rank measures, probes and runs the same chosen method."""

from __future__ import annotations

import pytest

from dssync.methods import get_method
from dssync.train import TrainConfig, run_training


@pytest.mark.slow
def test_auto_runs_the_method_it_chose_and_says_why():
    cfg = TrainConfig(workload="digits", sync="auto", epochs=1, max_steps=6, progress=False)
    s = run_training(cfg, workers=2)
    chosen = s["auto"]["method"]
    assert get_method(chosen).name == chosen and chosen != "auto"
    assert s["auto"]["reason"].startswith(f"{chosen}: predicted")
    assert s["auto"]["compute_s"] > 0 and s["steps"] == 6
    every = s["auto"]["every"]  # a local-step pick says how often it averaged
    assert every is None or (every in (4, 8, 16) and f"every {every} steps" in s["auto"]["reason"])
