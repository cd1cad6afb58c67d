"""Printing summaries as tables and writing them as JSON."""

from __future__ import annotations

import datetime
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dssync.lab.report.tables import compact_table
from dssync.lab.train.summary import write_json

__all__ = ["console", "fmt_ms", "provenance", "public_summary", "training_table", "write_json"]

# The terminal's width; 80 columns when piped or captured (every table fits: report.tables).
console = Console()


def provenance() -> dict[str, str | None]:
    """What a result file records of how it was made: the command, the date, dssync's commit
    (None outside a git checkout) and version."""
    from dssync import __version__

    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "command": shlex.join(["dssync", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or None,
        "version": __version__,
    }


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def training_table(summaries: list[dict[str, Any]]) -> Table:
    """What one run reached and what its steps cost, a row per figure and a column per run (80
    columns for one run on any number of workers: the per-worker figures wrap four to a line)."""
    first = summaries[0]
    metric = first["metric_name"]
    t = compact_table(
        f"{first['workload']} on {first['world_size']} workers", ["", *map(_method, summaries)]
    )
    rows = [
        (f"{metric} (averaged model)", lambda s: f"{s['final_metric']:.4f}"),
        (f"{metric} per worker", lambda s: _per_worker(s["worker_metric"])),
        ("SWA ensemble", lambda s: _maybe(s.get("swa_metric"))),
        ("consensus distance", lambda s: f"{s['consensus_distance']:.2e}"),
        ("iteration", lambda s: fmt_ms(s["iter_time_s"])),
        ("compute", lambda s: fmt_ms(s["compute_time_s"])),
        ("sync", lambda s: fmt_ms(s["sync_time_s"])),
        ("auto's prediction", _prediction),
    ]
    for label, cell in rows:
        if label == "SWA ensemble" and all(s.get("swa_metric") is None for s in summaries):
            continue  # no --swa-start
        if label == "auto's prediction" and all(_predicted(s) is None for s in summaries):
            continue  # no --sync auto
        t.add_row(label, *(cell(s) for s in summaries))
    return t


def _per_worker(values: list[float], per_line: int = 4) -> str:
    text = [f"{v:.4f}" for v in values]
    lines = [", ".join(text[i : i + per_line]) for i in range(0, len(text), per_line)]
    return "\n".join(lines)


def _maybe(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


# A prediction this many times off the measured iteration (either way) is flagged: the pick was
# made from a model of the cluster that this run did not match.
MISS = 2.0


def _predicted(s: dict[str, Any]) -> float | None:
    return (s.get("auto") or {}).get("predicted_s")


def prediction_miss(s: dict[str, Any]) -> float | None:
    """How many times auto's predicted iteration is off the measured one (>= 1), or None."""
    predicted, measured = _predicted(s), s.get("iter_time_s")
    if not predicted or not measured:
        return None
    return max(predicted / measured, measured / predicted)


def _prediction(s: dict[str, Any]) -> str:
    predicted = _predicted(s)
    if predicted is None:
        return ""
    miss = prediction_miss(s)
    text = fmt_ms(predicted)
    if miss is not None and miss > MISS:
        text += f" (MISSED: {miss:.1f}x off the measured)"
    return text


def _method(s: dict[str, Any]) -> str:
    cfg = s.get("config", {})
    if s.get("auto"):
        return f"auto:\n{s['sync']}"
    if s["sync"] == "dssync":
        return f"dssync ({cfg.get('schedule')}, k={cfg.get('group_size')})"
    return s["sync"]


def public_summary(s: dict[str, Any]) -> dict[str, Any]:
    """The summary without the per-step log (what --json writes)."""
    return {k: v for k, v in s.items() if k not in ("log",)}
