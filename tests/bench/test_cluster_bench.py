"""dssync bench: link-rate bounds, recovery measure, and a tiny run on the emulated cluster."""

from __future__ import annotations

import json

import pytest
import torch

from dssync.bench.bounds import lower_bound
from dssync.bench.cluster_worker import device_for
from dssync.bench.timings import recovery
from dssync.cli import main
from dssync.cluster import ClusterError, load_cluster, require_root_and_tools
from dssync.report.bench import bench_table


def _root_reason() -> str | None:
    try:
        require_root_and_tools()
    except ClusterError as exc:
        return str(exc)
    return None


def test_lower_bounds_follow_the_bottleneck():
    m = 40e6
    s2, s3 = load_cluster("s2-inter-rack"), load_cluster("s3-slow-host")
    assert lower_bound(s2, "ddp", m) == pytest.approx(2 * 7 / 8 * m * 8 / 200e6)
    assert lower_bound(s3, "ddp", m) == pytest.approx(2 * 7 / 8 * m * 8 / 100e6)
    assert lower_bound(s2, "dssync-topo", m) < lower_bound(s2, "ddp", m) / 3
    assert lower_bound(s3, "dssync-topo", m) < lower_bound(s3, "ddp", m) / 4


def test_recovery_counts_steps_after_contention():
    iters = [1.0] * 10 + [5.0] * 10 + [3.0] * 4 + [1.0] * 10
    timeline, t = [], 0.0
    for i, v in enumerate(iters):
        t += v
        timeline.append({"step": i, "end": t, "iter_s": v})
    applied = [(timeline[10]["end"] - 0.1, 100.0), (timeline[20]["end"] - 0.1, 1000.0)]
    out = recovery(timeline, applied, warmup=2, repeat=4)
    assert out["contention_steps"] == [10, 20] and out["pre_contention_iter_s"] == 1.0
    assert out["recovery_steps"] == 3 and out["recovery_cycles"] == 0.75


@pytest.mark.root
@pytest.mark.skipif(_root_reason() is not None, reason=_root_reason() or "")
def test_tiny_bench_run(tmp_path):
    out = tmp_path / "bench.json"
    main(
        [
            "bench",
            "--scenario",
            "tiny",
            "--params",
            "50000",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--no-probe",
            "--timeout",
            "120",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "b.png"),
            "--out-dir",
            str(tmp_path / "work"),
        ]
    )
    results = json.loads(out.read_text())["results"]["tiny"]
    assert set(results) == {"ddp", "hierarchical", "dssync", "dssync-topo"}
    for r in results.values():
        for key in ("sync_time_s", "iter_time_s", "lower_bound_s"):
            assert r[key] > 0, (key, r)
        assert r["max_link_bytes_per_iter"] > 0
    assert (tmp_path / "b.png").stat().st_size > 0


def test_device_choice_of_a_bench_worker(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_for("auto") == torch.device("cpu") == device_for("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert device_for("auto") == torch.device("cuda", 1) == device_for("cuda")


def test_bounds_know_aliases_and_leave_unmodelled_methods_blank():
    s2 = load_cluster("s2-inter-rack")
    assert lower_bound(s2, "bsp", 1e6) == lower_bound(s2, "ddp", 1e6) > 0
    assert lower_bound(s2, "local-sgd", 1e6) is None
    assert (
        bench_table(
            {
                "s2": {
                    "local-sgd": {
                        "iter_time_s": 0.5,
                        "sync_time_s": 0.1,
                        "lower_bound_s": None,
                        "max_link_bytes_per_iter": 1e6,
                    }
                }
            },
            1000,
        ).row_count
        == 1
    )
