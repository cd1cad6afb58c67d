"""Printing summaries as tables and writing them as JSON."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from dssync.train.summary import write_json

__all__ = ["console", "fmt_ms", "public_summary", "training_table", "write_json"]

# Piped or captured output gets a fixed width so tables are not squeezed into 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=160)


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def training_table(summaries: list[dict[str, Any]]) -> Table:
    """One row per run: final metric, worker spread, consensus distance, time split."""
    metric = summaries[0]["metric_name"]
    t = Table(title=f"{summaries[0]['workload']} on {summaries[0]['world_size']} workers")
    for col in [
        "method",
        f"{metric} (averaged model)",
        f"{metric} per worker",
        "consensus distance",
        "iteration",
        "compute",
        "sync",
    ]:
        t.add_column(col, justify="right" if col != "method" else "left")
    for s in summaries:
        workers = ", ".join(f"{m:.4f}" for m in s["worker_metric"])
        t.add_row(
            _method(s),
            f"{s['final_metric']:.4f}",
            workers,
            f"{s['consensus_distance']:.2e}",
            fmt_ms(s["iter_time_s"]),
            fmt_ms(s["compute_time_s"]),
            fmt_ms(s["sync_time_s"]),
        )
    return t


def _method(s: dict[str, Any]) -> str:
    cfg = s.get("config", {})
    if s["sync"] == "dssync":
        return f"dssync ({cfg.get('schedule')}, k={cfg.get('group_size')})"
    return s["sync"]


def public_summary(s: dict[str, Any]) -> dict[str, Any]:
    """The summary without the per-step log (what --json writes)."""
    return {k: v for k, v in s.items() if k not in ("log",)}
