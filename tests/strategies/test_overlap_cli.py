"""The overlapped methods through ``dssync train``: they run, and a killed run resumes bit-exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from cli_run import DIGITS, FAULT_CLI, load, run  # noqa: E402


@pytest.mark.timeout(400)
def test_overlap_trains_and_resumes_bit_for_bit(tmp_path):
    whole = tmp_path / "whole.json"
    r = run(["train", *DIGITS, "--sync", "dssync-overlap", "--json", str(whole)], timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    a = load(whole)
    assert a["final_metric"] > 0.5  # digits, one epoch: well above chance

    ckpt, out = tmp_path / "ckpt", tmp_path / "run.json"
    crash = [FAULT_CLI, "train", *DIGITS, "--sync", "dssync-overlap", "--checkpoint-dir", str(ckpt),
             "--checkpoint-every", "10", "--resume", "--timeout", "20", "--crash-rank", "1",
             "--crash-at-step", "25", "--json", str(out)]  # fmt: skip
    assert run(crash, timeout=150, module=None).returncode == 1
    r = run(crash, timeout=150, module=None)
    assert r.returncode == 0, r.stderr[-3000:]
    b = load(out)
    assert b["resumed_from"] == 20
    assert b["worker_model_sha256"] == a["worker_model_sha256"]  # bit-for-bit, every rank
    assert b["final_loss"] == a["final_loss"]


@pytest.mark.timeout(200)
def test_topology_overlap_trains(tmp_path):
    out = tmp_path / "run.json"
    r = run(["train", *DIGITS, "--sync", "dssync-topo-overlap", "--json", str(out)], timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    assert load(out)["final_metric"] > 0.5
