"""A preset that plans from link rates probes them before it trains, as ``--sync auto`` does,
and the run's summary says which plan it started from."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from dssync.lab.launch import spawn
from dssync.lab.train import TrainConfig
from dssync.lab.train.loop import train_worker


def _train_on_two_racks(sync: str):
    rank = dist.get_rank()
    os.environ["DSSYNC_HOST"] = str(10 + rank // 2)
    os.environ["DSSYNC_RACK"] = str(rank // 2)
    cfg = TrainConfig(workload="digits", sync=sync, epochs=1, max_steps=2, progress=False)
    return train_worker(cfg)["plan"]


@pytest.mark.timeout(180)
def test_the_topology_preset_starts_from_probed_rates_and_reports_its_plan():
    plans = spawn(_train_on_two_racks, 4, args=("dssync-topo",), timeout_s=150)
    assert all(p == plans[0] for p in plans)  # every rank planned alike
    plan = plans[0]
    # probed: the crossing pairs measured the uplink (unprobed, it reads "uplink ? Mbit/s")
    assert "2 racks" in plan["topology"] and "uplink ?" not in plan["topology"], plan
    assert plan["schedule"].startswith("TopologyAware(") and plan["switches"] == []


@pytest.mark.timeout(120)
def test_a_method_without_a_plan_reports_none():
    (plan, _) = spawn(_train_on_two_racks, 2, args=("bsp",), timeout_s=90)
    assert plan == {"topology": None, "schedule": None, "switches": []}
