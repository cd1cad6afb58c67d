"""docs/bench.md is what the `dssync bench` result files give."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_page", ROOT / "tools" / "bench_page.py")
bench_page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_page)


def test_the_page_is_current_and_every_file_records_how_it_was_made():
    assert bench_page.main(["--check"]) == 0, "run python tools/bench_page.py"
    files = sorted(bench_page.RESULTS.glob("*.json"))
    assert files
    for f in files:
        meta = json.loads(f.read_text())["meta"]
        assert meta["command"].startswith("dssync bench "), f
        assert meta["date"] and meta["commit"], f


def test_a_wire_label_is_set_against_its_fp32_twin():
    run = {"iter_time_s": 1.0, "max_link_bytes_per_iter": 8e6, "lower_bound_s": 0.5}
    methods = {
        "ddp": {**run, "ratio_to_ddp": 1.0, "lower_bound_s": None},
        "dssync-topo:every=4": run,
        "dssync-topo:every=4:wire=int8": {**run, "max_link_bytes_per_iter": 2e6},
        "dssync:wire=int8": run,  # no fp32 twin in this run: left blank
    }
    assert bench_page.fp32_twin("dssync-topo:every=4:wire=int8", methods) == "dssync-topo:every=4"
    assert bench_page.fp32_twin("dssync:wire=int8", methods) is None
    rows = {line.split(" | ")[0][2:]: line for line in bench_page.table(methods)[2:]}
    assert "| 2.0 | 0.25 | 500 | 2.00x |" in rows["dssync-topo:every=4:wire=int8"]
    assert "| 8.0 |  |  |  |" in rows["ddp"]  # no bound worked out: blank, not 0
