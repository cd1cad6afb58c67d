"""The report folder: summary.md, metric plots (PNG) and the raw per-step log (CSV)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any


def write_csv(path: Path, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Every step of every run: method, seed, step, epoch, time_s, loss, iter_s, sync_s, lr."""
    fields = ["method", "seed", "step", "epoch", "time_s", "loss", "iter_s", "sync_s", "lr"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for method, rs in runs.items():
            for r in rs:
                for row in r["log"]:
                    w.writerow({"method": method, "seed": r["config"]["seed"], **row})


def write_evals_csv(path: Path, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Every evaluation of the averaged model: method, seed, step, time_s and the metrics."""
    rows = [
        {"method": m, "seed": r["config"]["seed"], **e}
        for m, rs in runs.items()
        for r in rs
        for e in r["evals"]
    ]
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def plot_metric(
    path_time: Path,
    path_steps: Path,
    runs: dict[str, list[dict[str, Any]]],
    metric: str,
    title: str,
) -> None:
    """The averaged model's metric against training wall-clock time and against iterations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for path, xkey, xlabel in (
        (path_time, "time_s", "training time (s)"),
        (path_steps, "step", "iteration"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (method, rs) in enumerate(runs.items()):
            color = f"C{i}"
            for j, r in enumerate(rs):
                xs = [e[xkey] for e in r["evals"] if metric in e]
                ys = [e[metric] for e in r["evals"] if metric in e]
                ax.plot(
                    xs,
                    ys,
                    color=color,
                    marker="o",
                    markersize=3,
                    alpha=0.85,
                    label=method if j == 0 else None,
                )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _fmt(v: float | None, spec: str = ".4f") -> str:
    return "n/a" if v is None else format(v, spec)


def write_markdown(path: Path, summary: dict[str, Any], meta: dict[str, Any]) -> None:
    """A summary table a person wants to read, with what was run."""
    methods = summary["methods"]
    any_m = next(iter(methods.values()))
    metric = any_m["metric_name"]
    lines = [
        f"# {meta['workload']}: {', '.join(methods)} on {meta['workers']} workers",
        "",
        f"Seeds {meta['seeds']}, {meta['epochs']} epochs, {meta['where']}. Metric: {metric} of the globally "
        f"averaged model ({'higher' if any_m['higher_is_better'] else 'lower'} is better). "
        f"Target for time-to-target: {_fmt(summary['target'])} ({summary['target_source']}).",
        "",
        f"| method | final {metric} (mean ± std) | SWA ensemble | time to target (s) | iterations/s "
        "| sync per iteration (ms) | consensus distance |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in methods.items():
        ttt = _fmt(m["time_to_target_s"], ".2f")
        if m["time_to_target_s"] is not None and m["seeds_reaching_target"] < len(m["seeds"]):
            ttt += f" ({m['seeds_reaching_target']}/{len(m['seeds'])} seeds)"
        lines.append(
            f"| {name} | {_fmt(m['final_metric'])} ± {_fmt(m['final_metric_std'])} | {_fmt(m['swa_metric'])} "
            f"| {ttt} | {_fmt(m['iterations_per_s'], '.1f')} | {_fmt((m['sync_time_s'] or 0) * 1000, '.2f')} "
            f"| {_fmt(m['consensus_distance'], '.2e')} |"
        )
    lines += [
        "",
        "Time is training wall-clock time (evaluation excluded), measured on rank 0.",
        "",
        f"![{metric} against time](metric_vs_time.png)",
        f"![{metric} against iterations](metric_vs_step.png)",
        "",
        "Raw data: `steps.csv` (every step of every run), `evals.csv` (every evaluation), `summary.json`.",
        "",
    ]
    path.write_text("\n".join(lines))
