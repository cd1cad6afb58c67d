"""The report folder: summary.md, metric plots (PNG) and the raw per-step log (CSV)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from dssync.lab.report.summary import fmt, picked


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


def band(
    runs: list[dict[str, Any]], metric: str, xkey: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, median, low, high) of one method's seeds: each seed's curve interpolated linearly on
    the union of their evaluation points, kept where every seed has started and not ended."""
    import numpy as np

    curves = []
    for r in runs:
        pts = [(e[xkey], e[metric]) for e in r["evals"] if metric in e]
        if pts:
            curves.append((np.array([p[0] for p in pts]), np.array([p[1] for p in pts])))
    if not curves:
        return [], [], [], []
    lo_x = max(xs[0] for xs, _ in curves)
    hi_x = min(xs[-1] for xs, _ in curves)
    grid = np.unique(np.concatenate([xs for xs, _ in curves]))
    grid = grid[(grid >= lo_x) & (grid <= hi_x)]
    if grid.size == 0:
        return [], [], [], []
    ys = np.stack([np.interp(grid, xs, vs) for xs, vs in curves])
    return (
        grid.tolist(),
        np.median(ys, axis=0).tolist(),
        ys.min(axis=0).tolist(),
        ys.max(axis=0).tolist(),
    )


def plot_metric(
    path_time: Path,
    path_steps: Path,
    runs: dict[str, list[dict[str, Any]]],
    metric: str,
    title: str,
    target: float | None = None,
) -> None:
    """The averaged model's metric against training time (slowest rank) and against iterations:
    each method's median over its seeds as a line, their range as a band, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for path, xkey, xlabel in (
        (path_time, "time_s", "training time of the slowest rank (s)"),
        (path_steps, "step", "iteration"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        colors = plt.get_cmap("tab20").colors if len(runs) > 10 else [f"C{i}" for i in range(10)]
        ends = [max((e[xkey] for r in rs for e in r["evals"]), default=0) for rs in runs.values()]
        if xkey == "time_s" and min(ends, default=0) > 0 and max(ends) > 10 * min(ends):
            ax.set_xscale("log")  # methods an order of magnitude apart stay readable
        for i, (method, rs) in enumerate(runs.items()):
            xs, med, lo, hi = band(rs, metric, xkey)
            n = len(rs)
            chosen = sorted({picked(r["auto"]) for r in rs if "auto" in r})
            name = f"{method}: {', '.join(chosen)}" if chosen else method
            label = f"{name} (median of {n} seeds)" if n > 1 else name
            color = colors[i % len(colors)]
            ax.plot(xs, med, color=color, marker="o", markersize=2.5, label=label)
            if n > 1:
                ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)
        if target is not None:
            ax.axhline(target, color="0.3", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_xlabel(xlabel + (", log scale" if ax.get_xscale() == "log" else ""))
        ax.set_ylabel(metric)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _fmt(v: float | None, spec: str = ".4f") -> str:
    return "n/a" if v is None else format(v, spec)


def _span(s: dict[str, float] | None, spec: str) -> str:
    if s is None:
        return "n/a"
    return f"{format(s['median'], spec)} ({format(s['min'], spec)}-{format(s['max'], spec)})"


def write_markdown(path: Path, summary: dict[str, Any], meta: dict[str, Any]) -> None:
    """The time-to-train table a person wants to read, with what was run and the verdicts."""
    methods = summary["methods"]
    any_m = next((m for m in methods.values() if m["metric_name"]), next(iter(methods.values())))
    metric = any_m["metric_name"]
    ref = summary.get("reference", "bsp")
    lines = [
        f"# {meta['workload']}: {', '.join(methods)} on {meta['workers']} workers",
        "",
        f"Seeds {meta['seeds']}, {meta['epochs']} epochs, {meta['where']}. Metric: {metric} of the "
        f"globally averaged model ({'higher' if any_m['higher_is_better'] else 'lower'} is better). "
        f"Target: {_fmt(summary['target'])} ({summary['target_source']}).",
        "",
        "Median (min-max) over the seeds that reached the target. Time is training time of the "
        "slowest rank, evaluations excluded."
        + (
            " Each run stopped at the target (--stop-at-target): its final metric is where it "
            "stopped, and a run that never reached it trained to the end."
            if meta.get("stop_at_target")
            else ""
        ),
        "",
        f"| method | seeds reaching | time to target (s) | with the final average (s) "
        f"| steps to target | x {ref} | final {metric} | compute / iteration (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = (methods.get(ref) or {}).get("time_to_target")
    for name, m in methods.items():
        ttt = m["time_to_target"]
        ratio = "n/a" if ttt is None or base is None else f"{ttt['median'] / base['median']:.2f}"
        lo, hi = m["final_metric_range"]
        lines.append(
            f"| {name} | {m['seeds_reaching_target']}/{len(m['seeds'])} | {_span(ttt, '.1f')} "
            f"| {_span(m.get('time_with_average'), '.1f')} "
            f"| {_span(m['steps_to_target_spread'], '.0f')} | {ratio} "
            f"| {fmt(m['final_metric'])} ({fmt(lo)}-{fmt(hi)}) "
            f"| {fmt(m['compute_time_s'], '.0f', 1000)} / {fmt(m['iter_time_s'], '.0f', 1000)} |"
        )
    lines += ["", *[f"- {v}" for v in summary.get("verdicts", [])]]
    lines += [
        "",
        "Two methods differ beyond the spread when their ranges of time to target do not overlap "
        "(a seed that never reached the target counts as infinitely slow).",
        "",
        "The evaluated model is the global average of the ranks' parameters, which no rank holds "
        'while their replicas differ: "with the final average" adds what taking that average '
        "cost at the evaluation that reached the target (the slowest rank's training time plus "
        "the longest transfer of that average, counted from when every rank had come), what a "
        "run stopped there pays once for its model.",
        "",
        f"![{metric} against time](metric_vs_time.png)",
        f"![{metric} against iterations](metric_vs_step.png)",
        "",
        "Raw data: `steps.csv` (every step of every run), `evals.csv` (every evaluation), `summary.json`.",
        "",
    ]
    path.write_text("\n".join(lines))
