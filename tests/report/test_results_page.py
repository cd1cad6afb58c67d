"""docs/time-to-train.md and the README's result block are what the result files give."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("results_page", ROOT / "tools" / "results_page.py")
results_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results_page)


def test_the_page_and_the_readme_block_are_current():
    assert results_page.main(["--check"]) == 0, "run python tools/results_page.py"


def test_every_result_file_records_how_it_was_made():
    files = sorted((ROOT / "docs" / "results").glob("*.json"))
    assert files
    for f in files:
        meta = json.loads(f.read_text())["meta"]
        assert meta["command"].startswith("dssync compare --cluster"), f
        assert meta["date"] and meta["commit"], f


def test_every_accuracy_file_records_how_it_was_made():
    files = sorted(results_page.ACCURACY.glob("*.json"))
    assert files
    for f in files:
        meta = json.loads(f.read_text())["meta"]
        assert meta["command"].startswith("dssync compare --workload"), f
        assert "--cluster" not in meta["command"], f  # loopback: what a setting costs in accuracy
        assert meta["date"] and meta["commit"], f


def test_a_hand_edit_of_the_block_is_caught(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    head, rest = (ROOT / "README.md").read_text().split(results_page.BEGIN, 1)
    block, tail = rest.split(results_page.END, 1)
    edited = block.replace("x |", "x (hand edit) |", 1)
    assert edited != block
    readme.write_text(head + results_page.BEGIN + edited + results_page.END + tail)
    monkeypatch.setattr(results_page, "README", readme)
    assert results_page.main(["--check"]) == 1
