"""--sync auto in a run: every rank measures, probes and runs the same chosen method."""

from __future__ import annotations

import pytest

from dssync.lab.methods import get_method
from dssync.lab.train import TrainConfig, run_training
from dssync.lab.train.auto import TIMED_PASSES


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
    if every is not None:  # and applies DiLoCo's outer step at each average
        assert s["auto"]["outer"] == "auto" and "outer Nesterov" in s["auto"]["reason"]
    else:
        assert s["auto"]["outer"] is None


def _timed_spans():
    import os
    import time

    import torch
    import torch.distributed as dist

    from dssync.lab.train.auto import compute_time
    from dssync.lab.train.data import RankData

    os.environ["DSSYNC_CLUSTER"] = "test"  # as the emulator sets it for its workers
    data = RankData.load(TrainConfig(workload="digits"), dist.get_rank(), dist.get_world_size())
    spans, forward = [], data.wl.loss

    def timed(model, batch):
        t0 = time.monotonic()
        out = forward(model, batch)
        spans.append((t0, time.monotonic()))
        return out

    data.wl.loss = timed
    seconds = compute_time(data, data.wl.model(), torch.device("cpu"), timeout_s=60)
    return seconds, spans


def test_on_the_emulated_cluster_ranks_time_their_compute_one_after_another():
    from dssync.lab.launch import spawn

    (s0, spans0), (s1, spans1) = spawn(_timed_spans, 2, timeout_s=120)
    assert s0 == s1 > 0  # the slowest rank's figure, the same on both
    assert len(spans0) == len(spans1) == TIMED_PASSES + 1  # a warm-up, then the timed passes
    assert max(end for _, end in spans0) < min(start for start, _ in spans1)  # rank 0 first
