"""Tables and plots of ``dssync bench`` results (see :mod:`dssync.experiments.cluster_bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table


def bench_table(results: dict[str, dict[str, Any]], params: int, compute_ms: float = 0.0) -> Table:
    """One row per (scenario, method): iteration, compute, exposed and sync time, ratios, bytes.

    ``compute`` is a step with no synchronization, timed by each rank before training;
    ``exposed`` is iteration minus compute (the averaging time not hidden behind compute);
    ``vs max(C, A)`` is an overlapped method's iteration over the larger of compute and its
    blocking counterpart's sync time in the same run (1.0 would hide all of it).
    """
    work = f", {compute_ms:g} ms of matrix work per step" if compute_ms else ""
    t = Table(
        title=f"dssync bench: flat model of {params:,} parameters{work} (means per iteration)"
    )
    for col in [
        "scenario",
        "method",
        "iteration",
        "compute",
        "exposed",
        "sync",
        "vs DDP",
        "vs max(C, A)",
        "lower bound",
        "busiest link / iter",
        "S4 recovery",
    ]:
        t.add_column(col, justify="left" if col in ("scenario", "method") else "right")
    for scenario, methods in results.items():
        for method, r in methods.items():
            ratio = r.get("ratio_to_ddp")
            rec = r.get("recovery_cycles")
            rec_text = (
                ""
                if "recovery_steps" not in r
                else (
                    "not recovered"
                    if rec is None
                    else f"{r['recovery_steps']} steps ({rec:.2f} cycles)"
                )
            )
            hidden = r.get("ratio_to_hidden")
            t.add_row(
                scenario,
                method,
                _ms(r["iter_time_s"]),
                _ms(r.get("compute_s")),
                _ms(r.get("exposed_s")),
                _ms(r["sync_time_s"]),
                "" if ratio is None else f"{ratio:.2f}x",
                "" if hidden is None else f"{hidden:.2f}x",
                _ms(r["lower_bound_s"]),
                f"{r['max_link_bytes_per_iter'] / 1e6:.1f} MB",
                rec_text,
            )
    return t


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.0f} ms"


def bench_plot(results: dict[str, dict[str, Any]], path: str | Path) -> None:
    """Bars of iteration time per scenario and method (ticks: lower bounds); S4's timeline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dynamic = [s for s, m in results.items() if any("recovery_steps" in r for r in m.values())]
    fig, axes = plt.subplots(
        1, 2 if dynamic else 1, figsize=(13 if dynamic else 7, 4.5), squeeze=False
    )
    ax = axes[0][0]
    scenarios = list(results)
    methods = sorted(
        {m for r in results.values() for m in r},
        key=lambda m: (
            list(next(iter(results.values()))).index(m) if m in next(iter(results.values())) else 99
        ),
    )
    width = 0.8 / max(len(methods), 1)
    for j, m in enumerate(methods):
        xs = [i + j * width for i, s in enumerate(scenarios) if m in results[s]]
        ys = [results[s][m]["iter_time_s"] for s in scenarios if m in results[s]]
        lb = [results[s][m]["lower_bound_s"] for s in scenarios if m in results[s]]
        ax.bar(xs, ys, width, label=m)
        ticks = [(x, b) for x, b in zip(xs, lb, strict=True) if b is not None]
        if ticks:
            ax.scatter(*zip(*ticks, strict=True), marker="_", color="black", s=200, zorder=3)
    ax.set_xticks(
        [i + width * (len(methods) - 1) / 2 for i in range(len(scenarios))], scenarios, fontsize=8
    )
    ax.set_ylabel("seconds per iteration (black tick: link-rate lower bound)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    if dynamic:
        ax = axes[0][1]
        s = dynamic[0]
        for m, r in results[s].items():
            ax.plot(
                [p["step"] for p in r["timeline"]], [p["iter_s"] for p in r["timeline"]], label=m
            )
            if r.get("contention_steps"):
                on, off = r["contention_steps"]
                ax.axvspan(on, off, alpha=0.05, color="red")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("seconds per iteration")
        ax.set_title(f"{s}: per-iteration time (shaded: contention, per method)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
