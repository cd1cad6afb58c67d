"""Printing summaries as tables and writing them as JSON."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

# Piped or captured output gets a fixed width so tables are not squeezed into 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=160)


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` atomically: a partial file never replaces a good one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=_plain)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def training_table(summaries: list[dict[str, Any]]) -> Table:
    """One row per run: final metric, worker spread, consensus distance, time split."""
    metric = summaries[0]["metric_name"]
    t = Table(title=f"{summaries[0]['workload']} on {summaries[0]['world_size']} workers")
    for col in ["method", f"{metric} (averaged model)", f"{metric} per worker", "consensus distance",
                "iteration", "compute", "sync"]:
        t.add_column(col, justify="right" if col != "method" else "left")
    for s in summaries:
        workers = ", ".join(f"{m:.4f}" for m in s["worker_metric"])
        t.add_row(_method(s), f"{s['final_metric']:.4f}", workers, f"{s['consensus_distance']:.2e}",
                  fmt_ms(s["iter_time_s"]), fmt_ms(s["compute_time_s"]), fmt_ms(s["sync_time_s"]))
    return t


def _method(s: dict[str, Any]) -> str:
    cfg = s.get("config", {})
    if s["sync"] == "dssync":
        return f"dssync ({cfg.get('schedule')}, k={cfg.get('group_size')})"
    return s["sync"]


def public_summary(s: dict[str, Any]) -> dict[str, Any]:
    """The summary without the per-step log (what --json writes)."""
    return {k: v for k, v in s.items() if k not in ("log",)}
