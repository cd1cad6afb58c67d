"""examples/elastic.py (the recipe docs/guide/elastic.md shows) runs, and every replica ends
with the same model."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from dssync.lab.launch import run_contained

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_elastic_example_ends_with_one_model_on_every_replica():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = run_contained(
        [sys.executable, str(ROOT / "examples" / "elastic.py")], 180, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses = dict(re.findall(r"replica (\d+): loss (-?\d+\.\d{6})", done.stdout))
    assert sorted(losses) == ["0", "1", "2"], done.stdout
    assert len(set(losses.values())) == 1, losses
