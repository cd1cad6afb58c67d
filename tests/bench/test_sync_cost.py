"""bench-sync's measurement on a tiny model: every figure present, positive and consistent."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from dssync.lab.bench.sync_cost import measure
from dssync.lab.launch import spawn

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from procs import run  # noqa: E402  (a session of its own: killed whole on timeout)


def test_measure_reports_paired_overhead():
    out = spawn(measure, 4, args=(20_000, 2, 5, 0, 0.02), timeout_s=120)
    r = out[0]
    assert r == out[1]  # every rank reports the same slowest-rank figures
    assert r["world_size"] == 4 and r["steps"] == 5 and r["bucket_mb"] == 0.02
    for key in ("raw_s", "dssync_s", "ddp_backward_s", "local_backward_s"):
        assert r[key] > 0, key
    assert r["overhead_q1"] <= r["overhead"] <= r["overhead_q3"]
    assert r["overhead_of_medians"] == pytest.approx(r["dssync_s"] / r["raw_s"])
    assert r["raw_avg_s"] > 0 and r["overhead_vs_raw_avg"] > 0
    assert r["raw_fp32_exchange_s"] == r["raw_exchange_s"] > 0  # fp32: the one exchange
    assert r["overhead_vs_fp32_exchange"] == r["overhead_vs_raw_exchange"] > 0


def test_measure_with_int8_reports_its_bytes_and_its_own_cost():
    r = spawn(measure, 2, args=(20_000, 2, 3, 0, 0.02, "int8"), timeout_s=120)[0]
    assert r["wire"] == "int8" and r["encode_s"] > 0
    assert r["wire_bytes"] < 0.26 * 4 * 20_000 and r["dssync_s"] > 0
    # the int8 exchange is its own reference, timed beside the fp32 one
    assert r["raw_exchange_s"] > 0 and r["raw_fp32_exchange_s"] > 0
    assert r["raw_exchange_s"] != r["raw_fp32_exchange_s"]
    assert r["overhead_vs_raw_exchange"] > 0 and r["overhead_vs_fp32_exchange"] > 0


def test_cli_prints_and_writes_json(tmp_path):
    path = tmp_path / "b.json"
    r = run(
        [
            "-m",
            "dssync",
            "bench-sync",
            "--params",
            "20000",
            "--params",
            "30000",
            "--wire",
            "int8",
            "--workers",
            "2",
            "--steps",
            "3",
            "--json",
            str(path),
        ],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    assert "overhead" in r.stdout and "DDP" in r.stdout
    for n in ("20,000", "30,000"):  # the summary: each size's DS-Sync / raw exchange per wire
        assert re.search(rf"{n} │ +2 │ +[0-9.]+x │", r.stdout), r.stdout
    rows = json.loads(path.read_text())
    assert [(row["numel"], row["world_size"], row["wire"]) for row in rows] == [
        (20_000, 2, "int8"),
        (30_000, 2, "int8"),
    ]
    assert all(row["overhead"] > 0 for row in rows)


def test_scale_makes_no_group_after_step1_while_the_old_path_does():
    from dssync.lab.bench.sync_cost import measure_scale

    r = spawn(measure_scale, 4, args=(2_000, 12), timeout_s=180)[0]
    assert r["new_groups_after_step1"] == 0
    assert r["old_groups_after_step1"] > 0  # 4 ranks have 6 pairs; step 1 meets at most 2
    for key in ("new_p50_s", "new_p99_s", "old_p50_s", "tag_p50_s", "new_start_s"):
        assert r[key] > 0, key
    assert r["new_p50_s"] <= r["new_p99_s"]


def test_scale_takes_the_nonfinite_option(tmp_path):
    path = tmp_path / "s.json"
    args = ["-m", "dssync", "bench-sync", "--scale", "--params", "2000", "--workers", "2"]
    r = run([*args, "--steps", "3", "--nonfinite", "spread", "--json", str(path)], timeout=180)
    assert r.returncode == 0, r.stderr
    assert "nonfinite=spread" in r.stdout
    (row,) = json.loads(path.read_text())
    assert row["nonfinite"] == "spread" and row["new_p50_s"] > 0
