"""`dssync plan --measure-local 2`: real runs of bench-sync and train, measured against predicted.

Slow (three subprocesses that import torch): listed in tests/conftest.py's SLOW.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from dssync.lab.launch import run_contained

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_two_local_ranks_are_measured_and_predicted():
    env = {**os.environ, "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "dssync", "plan", "--measure-local", "2", "--steps", "3", "--json"]
    done = run_contained(cmd, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["world"] == 2 and got["params"] == 4938
    assert [c.split()[1] for c in got["commands"]] == ["bench-sync", "train", "train"]
    assert got["host_s_per_byte"] > 0
    for method in ("dssync", "bsp"):
        measured = got["measured"][method]
        assert measured["steps"] == 3
        assert 0 < measured["sync_s"] < measured["iter_s"]
        assert got["predicted"][method] > 0
        want = (got["predicted"][method] - measured["sync_s"]) / measured["sync_s"]
        assert got["error"][method] == pytest.approx(want)
    assert len(got["load_average"]["start"]) == 3
