"""Summaries over seeds: mean and spread of the final metric, time to a target, throughput."""

from __future__ import annotations

import statistics
from typing import Any

from rich.table import Table

from dssync.report.tables import compact_table


def time_to_target(
    evals: list[dict[str, Any]], metric: str, target: float, higher_is_better: bool
) -> float | None:
    """Training seconds until the averaged model first reached ``target`` (None if it never did)."""
    for e in evals:
        value = e.get(metric)
        if value is None:
            continue
        if (value >= target) if higher_is_better else (value <= target):
            return float(e["time_s"])
    return None


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _std(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.stdev(values) if len(values) > 1 else (0.0 if values else None)


def method_summary(runs: list[dict[str, Any]], target: float | None) -> dict[str, Any]:
    """One method's runs (one per seed) -> the figures of the comparison table."""
    first = runs[0]
    metric, higher = first["metric_name"], first["higher_is_better"]
    finals = [r["final_metric"] for r in runs]
    reach = (
        [time_to_target(r["evals"], metric, target, higher) for r in runs]
        if target is not None
        else []
    )
    reached = [t for t in reach if t is not None]
    return {
        "metric_name": metric,
        "higher_is_better": higher,
        "seeds": [r["config"]["seed"] for r in runs],
        "final_metric": _mean(finals),
        "final_metric_std": _std(finals),
        "final_metrics": finals,
        "swa_metric": _mean([r.get("swa_metric") for r in runs]),
        "swa_metric_std": _std([r.get("swa_metric") for r in runs]),
        "target": target,
        # Mean over the seeds that reached the target; None when no seed did.
        "time_to_target_s": _mean(reached) if reached else None,
        "seeds_reaching_target": len(reached),
        "iterations_per_s": _mean(
            [r["steps"] / r["train_time_s"] for r in runs if r["train_time_s"] > 0]
        ),
        "iter_time_s": _mean([r["iter_time_s"] for r in runs]),
        "sync_time_s": _mean([r["sync_time_s"] for r in runs]),
        "consensus_distance": _mean([r["consensus_distance"] for r in runs]),
        "train_time_s": _mean([r["train_time_s"] for r in runs]),
    }


def summarize(
    runs: dict[str, list[dict[str, Any]]], target: float | None = None, reference: str = "bsp"
) -> dict[str, Any]:
    """Per-method figures. The target defaults to the reference method's mean final metric."""
    source = "given"
    if target is None:
        ref = runs.get(reference) or next(iter(runs.values()))
        target = sum(r["final_metric"] for r in ref) / len(ref)
        source = f"mean final metric of {reference if reference in runs else next(iter(runs))}"
    return {
        "target": target,
        "target_source": source,
        "methods": {m: method_summary(rs, target) for m, rs in runs.items()},
    }


def summary_table(summary: dict[str, Any]) -> Table:
    """The comparison as a terminal table (80 columns): one row per method, what `dssync compare`
    prints. Time to target in training seconds, sync in ms per iteration."""
    t = compact_table(
        f"target {summary['target']:.4f} ({summary['target_source']})",
        [
            "method",
            "final\n(mean ± std)",
            "SWA",
            "time to\ntarget",
            "it/s",
            "sync\nms/it",
            "consensus",
        ],
    )
    for name, m in summary["methods"].items():
        ttt = "n/a" if m["time_to_target_s"] is None else _seconds(m["time_to_target_s"])
        swa = "n/a" if m["swa_metric"] is None else f"{m['swa_metric']:.4f}"
        t.add_row(
            name,
            f"{m['final_metric']:.4f} ± {m['final_metric_std']:.4f}",
            swa,
            ttt,
            f"{m['iterations_per_s']:.1f}",
            f"{m['sync_time_s'] * 1000:.2f}",
            f"{m['consensus_distance']:.1e}",
        )
    return t


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 100 else f"{s:.0f} s"
