"""Every table the command line prints fits 80 columns: at its natural width (nothing wrapped or
cut to make it fit) and on a console forced to 80 columns, as a piped run gets."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from dssync.lab.cli.output import console, training_table
from dssync.lab.cli.plan_cmd import TABLE_TOPOLOGIES
from dssync.lab.cli.straggler_cmd import straggler_table
from dssync.lab.methods import method_names
from dssync.lab.plan.clusters import cluster_for
from dssync.lab.plan.tables import make_plan, plan_table, scale_table
from dssync.lab.plan.validate import validate_table
from dssync.lab.report.summary import summarize, summary_table

LONGEST = max(method_names(), key=len)  # the widest method column a table can get


def _render(table, width: int) -> list[str]:
    out = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    out.print(table)
    return out.export_text().splitlines()


def _fits(table) -> None:
    natural = _render(table, 400)
    assert max(len(line.rstrip()) for line in natural) <= 80, "\n".join(natural)
    forced = _render(table, 80)
    assert [ln.rstrip() for ln in forced] == [ln.rstrip() for ln in natural], "\n".join(forced)


def _run(workers: int, sync: str = "dssync") -> dict:
    return {
        "metric_name": "mlm_accuracy",
        "workload": "bert",
        "world_size": workers,
        "worker_metric": [0.5 + i / 1000 for i in range(workers)],
        "final_metric": 0.97,
        "swa_metric": 0.9751,
        "consensus_distance": 8.6e-5,
        "iter_time_s": 1.23456,
        "compute_time_s": 1.0,
        "sync_time_s": 0.22,
        "sync": sync,
        "config": {"schedule": "butterfly", "group_size": 16},
    }


@pytest.mark.parametrize("workers", [2, 8, 64])
def test_train_summary_fits_any_number_of_workers(workers):
    _fits(training_table([_run(workers)]))
    lines = _render(training_table([_run(workers)]), 80)
    text = "".join(lines)
    assert "0.5000" in text and f"{0.5 + (workers - 1) / 1000:.4f}" in text


def test_compare_summary_fits_with_the_longest_method_name():
    def run(seed: int, scale: float) -> dict:
        evals = [
            {"step": 10 * i, "time_s": 123.4 * scale * i, "accuracy": 0.3 * i} for i in (1, 2, 3)
        ]
        return {
            "config": {"seed": seed},
            "metric_name": "accuracy",
            "higher_is_better": True,
            "final_metric": 0.97,
            "evals": evals,
            "steps": 30,
            "train_time_s": 1234.5,
            "iter_time_s": 0.12219,
            "sync_time_s": 0.1,
            "consensus_distance": 8.6e-5,
        }

    runs = {LONGEST: [run(s, 1.0 + s) for s in range(5)], "bsp": [run(0, 9.0)]}
    summary = summarize(runs, 0.884, source="mnist's declared target")
    _fits(summary_table(summary))
    assert LONGEST in "\n".join(_render(summary_table(summary), 80))


def test_straggler_table_fits():
    row = {
        "others_iter_s": 1.23456,
        "others_iter_straggler_s": 12.3456,
        "added_ms": 1234.56,
        "slowdown": 10.0,
    }
    _fits(straggler_table([{**row, "method": LONGEST}], "digits, 64 workers, rank 0 +20 ms/step"))


def test_plan_tables_fit():
    _fits(plan_table(make_plan(cluster_for("s2-inter-rack", None), 4_000_000, 0.05)))
    # One topology at one scale: the columns are the same for every --table topology, and the
    # full table (to 1,024 workers) takes minutes on 2 cores.
    _fits(scale_table(TABLE_TOPOLOGIES[1], 4_000_000, 0.05, scales=(64,)))
    bench = Path(__file__).parents[1] / "plan" / "bench-emulated-4m.json"
    _fits(validate_table(json.loads(bench.read_text())))


def test_piped_output_is_80_columns():
    assert console.width == 80  # pytest captures stdout: not a terminal, COLUMNS unset


def test_auto_names_the_method_it_ran_and_flags_a_prediction_far_off():
    run = _run(4, sync="dssync-topo-local")
    run["auto"] = {"method": "dssync-topo-local", "predicted_s": 0.0002}  # 0.2 ms
    run["iter_time_s"] = 0.00807  # measured 8.07 ms: 40x off
    text = "\n".join(_render(training_table([run]), 80))
    assert "auto:" in text and "dssync-topo-local" in text and "dssync-top..." not in text
    assert "MISSED: 40.4x off" in text
    run["iter_time_s"] = 0.0003  # 1.5x: within what a model of the cluster may miss
    text = "\n".join(_render(training_table([run]), 80))
    assert "0.20 ms" in text and "MISSED" not in text and "dssync-top..." not in text
    _fits(training_table([run]))
    plain = _run(4)
    assert "auto's prediction" not in "\n".join(_render(training_table([plain]), 80))
