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


def _race(date: str, commit: str, times: dict[str, float | None]) -> dict:
    def entry(t):
        span = None if t is None else {"median": t, "min": t * 0.9, "max": t * 1.1}
        return {"time_to_target": span, "seeds_reaching_target": 3, "seeds": [0, 1, 2]}

    meta = {"where": "emulated cluster s2", "workload": "mnist", "epochs": 12}
    meta.update(date=date, commit=commit, title=f"race {commit}")
    return {"meta": meta, "target": 0.91, "methods": {n: entry(t) for n, t in times.items()}}


def test_the_readme_block_shows_each_clusters_newest_race_and_borrows_bsp_only_saying_so():
    old = _race("2026-12-04 10:00", "aaa", {"bsp": 50.0, "diloco": 3.0, "dssync-topo": 2.5})
    new = _race("2026-12-05 09:00", "bbb", {"diloco": 3.0, "dssync-topo": 2.0})
    block = results_page.readme_block({"new": new, "old": old})
    rows = [r for r in block.splitlines() if r.startswith("| race")]
    assert len(rows) == 1 and rows[0].startswith(
        "| race bbb | 50.0 s (its race of 2026-12-04, aaa)"
    )
    assert "| 0.67x |" in rows[0]  # DS-Sync against the best other of the newest race
    own = results_page.readme_block({"old": old})
    assert "| race aaa | 50.0 s |" in own  # its own BSP: nothing borrowed
    never = _race("2026-12-04 10:00", "ccc", {"bsp": None, "diloco": 3.0, "dssync-topo": 2.5})
    assert "race ccc" not in results_page.readme_block({"never": never})  # no BSP time: no row


def test_the_language_models_races_come_first_in_the_readme_block():
    mnist = _race("2026-12-06 10:00", "mmm", {"bsp": 50.0, "diloco": 3.0, "dssync-topo": 2.5})
    lm = _race("2026-12-05 10:00", "lll", {"bsp": 40.0, "diloco": 30.0, "dssync-topo": 20.0})
    lm["meta"]["workload"] = "lm"
    block = results_page.readme_block({"s2": mnist, "lm/s2": lm})
    rows = [r for r in block.splitlines() if r.startswith("| race")]
    assert [r.split(" |")[0] for r in rows] == ["| race lll", "| race mmm"]


def test_a_race_no_other_remedy_finished_says_so_and_a_seed_short_ranks_behind():
    race = _race("2026-12-06 10:00", "nnn", {"bsp": 50.0, "diloco": None, "dssync": 50.0})
    race["methods"]["dssync-topo"] = dict(race["methods"]["dssync"])
    race["methods"]["dssync"]["times_to_target_s"] = [49.0, 50.0, 51.0]
    race["methods"]["dssync-topo"]["times_to_target_s"] = [40.0, None, 55.0]  # median: 55
    race["methods"]["dssync-topo"]["time_to_target"] = {"median": 47.5, "min": 40, "max": 55}
    rows = [r for r in results_page.readme_block({"r": race}).splitlines() if "race nnn" in r]
    assert len(rows) == 1
    assert "| dssync 1.00x | none of diloco reached the target | n/a |" in rows[0]
    # the fastest missed a seed: its ratio (over the seeds that reached it) says so
    race["methods"]["dssync"]["times_to_target_s"] = [60.0, 61.0, 62.0]
    race["methods"]["dssync"]["time_to_target"] = {"median": 61.0, "min": 60, "max": 62}
    rows = [r for r in results_page.readme_block({"r": race}).splitlines() if "race nnn" in r]
    assert "| dssync-topo 0.95x (2/3 seeds) |" in rows[0]
    # a race of BSP and DS-Sync alone keeps its row and says no other remedy ran
    del race["methods"]["diloco"]
    rows = [r for r in results_page.readme_block({"r": race}).splitlines() if "race nnn" in r]
    assert "| none in this race | n/a |" in rows[0]
