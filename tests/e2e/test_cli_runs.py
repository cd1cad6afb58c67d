"""The CLI as a user runs it: `dssync train --json` and `dssync compare` write what they promise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KEYS = {"final_accuracy", "worker_accuracy", "consensus_distance", "iter_time_s", "compute_time_s", "sync_time_s"}


def _dssync(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dssync", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(400)
def test_train_writes_the_json_summary(tmp_path):
    out = tmp_path / "run.json"
    r = _dssync("train", "--workload", "digits", "--workers", "3", "--group-size", "2", "--epochs", "1",
                "--quiet", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert KEYS <= set(data)
    assert len(data["worker_accuracy"]) == 3 and 0.5 < data["final_accuracy"] <= 1
    assert data["iter_time_s"] == pytest.approx(data["compute_time_s"] + data["sync_time_s"], rel=1e-6)
    assert "consensus distance" in r.stdout


@pytest.mark.timeout(400)
def test_compare_writes_a_report_folder(tmp_path):
    out = tmp_path / "report"
    r = _dssync("compare", "--workload", "digits", "--workers", "2", "--epochs", "1", "--seeds", "2",
                "--methods", "bsp,dssync,local-sgd", "--quiet", "--out", str(out), "--json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    for name in ["summary.md", "metric_vs_time.png", "metric_vs_step.png", "steps.csv", "evals.csv", "summary.json"]:
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((tmp_path / "s.json").read_text())
    for method in ["bsp", "dssync", "local-sgd"]:
        m = summary["methods"][method]
        assert {"final_metric", "final_metric_std", "metric_name", "time_to_target_s", "swa_metric"} <= set(m)
        assert m["metric_name"] == "accuracy" and 0.5 < m["final_metric"] <= 1
    rows = (out / "steps.csv").read_text().splitlines()
    assert rows[0].startswith("method,seed,step") and len(rows) > 3 * 2 * 10
    assert "| dssync |" in (out / "summary.md").read_text()
