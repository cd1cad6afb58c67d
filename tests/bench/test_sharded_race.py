"""The sharded lm race's launch path on the emulated cluster: one FSDP2 replica per rack (root)."""

from __future__ import annotations

import math

import pytest

from dssync.lab.bench.sharded_race import race
from dssync.lab.cluster import ClusterError, parse_cluster, require_root_and_tools


def _root_reason() -> str | None:
    try:
        require_root_and_tools()
    except ClusterError as exc:
        return str(exc)
    return None


# 2 racks x 1 host x 2 workers: 2 replicas of 2 shards, the replicas joined by the uplink.
SPEC = """
[cluster]
racks = 2
hosts_per_rack = 1
workers_per_host = 2
host_rate_mbit = 1000
rack_uplink_mbit = 200
"""


@pytest.mark.root
@pytest.mark.timeout(240)
@pytest.mark.skipif(_root_reason() is not None, reason=_root_reason() or "")
def test_sharded_race_runs_replicas_per_rack_and_ends_with_one_model(tmp_path):
    spec = parse_cluster(SPEC, "sharded race (test)")
    tiny = ["layers=1", "d_model=16", "context=16"]
    # every=4 and 6 steps: the replicas trained 2 steps apart since their last average
    (row,) = race(
        spec, ["dssync-every4"], [0], steps=6, eval_every=3, eval_windows=32,
        workload_options=tiny, work_dir=tmp_path, timeout_s=200, log=lambda line: None,
    )  # fmt: skip
    assert row["ranks"] == 4
    assert len(row["models_before_average"]) == 2  # one model per replica before average_all
    assert len(row["models"]) == 1  # every rank of every replica: one full model after
    assert [p["step"] for p in row["curve"]] == [3, 6]
    assert all(math.isfinite(p["loss"]) and p["train_s"] > 0 for p in row["curve"])
