"""End to end on the default data: DS-Sync reaches at least 97% of BSP's accuracy, same epochs."""

from __future__ import annotations

import pytest

from dssync.lab.train import TrainConfig, run_training


@pytest.mark.timeout(600)
def test_dssync_reaches_97_percent_of_bsp_on_mnist():
    common = dict(workload="mnist", epochs=2, seed=0, progress=False)
    bsp = run_training(TrainConfig(sync="bsp", **common), workers=4)
    ds = run_training(
        TrainConfig(sync="dssync", schedule="shuffle", group_size=2, **common), workers=4
    )
    assert bsp["final_accuracy"] > 0.80, bsp["final_accuracy"]  # BSP itself learned
    assert ds["final_accuracy"] >= 0.97 * bsp["final_accuracy"], (
        ds["final_accuracy"],
        bsp["final_accuracy"],
    )
    # DS-Sync's workers really differ before the final average, and stay close.
    assert 0 < ds["consensus_distance"] < 0.05
    assert bsp["consensus_distance"] == 0
    assert len(ds["worker_accuracy"]) == 4 and ds["steps"] == bsp["steps"] > 0
