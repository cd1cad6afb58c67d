"""Tables and plots of ``dssync bench`` results (see :mod:`dssync.lab.experiments.cluster_bench`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table


def bench_table(
    results: dict[str, dict[str, Any]], params: int, compute_ms: float = 0.0, kind: str = "cpu"
) -> Table:
    """One heading row per scenario, one row per method; seconds per iteration; fits 80 columns.

    ``mean`` is the pace after warm-up; ``p99`` and ``worst`` are over the steps after warm-up,
    each step timed on its slowest rank; ``x DDP`` is the mean over DDP's in the same run;
    ``bound`` is the link-rate lower bound (:mod:`dssync.lab.bench.bounds`) and ``x bound`` the mean
    over it; ``x step`` is the mean over the step bound (a DS-Sync schedule's busiest link step by
    step, as ranks held in step by their pairs need; the bound for other methods; its seconds
    are ``step_bound_s`` in the JSON). With matrix work per step (``compute_ms``), ``compute`` (a
    step with no synchronization, timed by each rank before training), ``exposed`` (mean minus
    compute), ``x max`` (an overlapped method's mean over max(C, A): the larger of compute and
    its blocking counterpart's sync time in the same run; 1.0 would hide all of it), ``x max/t``
    (the same over the mean of max(C, A_t), step by step: a step whose averaging outlasts the
    compute cannot be hidden) and ``MB/it`` (the bytes on the busiest link per iteration) take
    the places of worst, sync, the bounds and their ratios, all left to the JSON.
    """
    what = "compute (an idle wait)" if kind == "idle" else "matrix work"
    work = f", {compute_ms:g} ms of {what} a step" if compute_ms else ""
    t = Table(
        title=f"dssync bench: {params:,} parameters{work}; s per iteration",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    cols = ["method", "mean", "p99", "worst", "sync", "x DDP", "bound", "x bound", "x step"]
    if compute_ms:
        cols = ["method", "mean", "p99", "compute", "exposed", "x max", "x max/t", "x DDP", "MB/it"]
    for col in cols:
        t.add_column(col, justify="left" if col == "method" else "right")
    for scenario, methods in results.items():
        t.add_row(f"[bold]{scenario}[/bold]", *[""] * (len(cols) - 1))
        for method, r in methods.items():
            bound, step = r.get("lower_bound_s"), r.get("step_bound_s")
            cells = {
                "method": f" {method}",
                "mean": _s(r["iter_time_s"]),
                "p99": _s(r.get("p99_iter_s")),
                "worst": _s(r.get("worst_iter_s")),
                "sync": _s(r["sync_time_s"]),
                "compute": _s(r.get("compute_s")),
                "exposed": _s(r.get("exposed_s")),
                "x max": _x(r.get("ratio_to_hidden")),
                "x max/t": _x(r.get("ratio_to_hidden_per_step")),
                "x DDP": _x(r.get("ratio_to_ddp")),
                "bound": _s(bound),
                "x bound": _x(r["iter_time_s"] / bound if bound else None),
                "x step": _x(r["iter_time_s"] / step if step else None),
                "MB/it": f"{r['max_link_bytes_per_iter'] / 1e6:.1f}",
            }
            t.add_row(*(cells[c] for c in cols))
    return t


def recovery_table(results: dict[str, dict[str, Any]]) -> Table | None:
    """Scenarios with timed link changes: settled paces and the steps each change took to settle.

    ``bound`` is the link-rate bound while contended. ``on`` counts steps from the step in which
    contention began until a cycle's mean iteration is within 20% of the contended settled pace;
    ``off`` the same from its end (see :mod:`dssync.lab.bench.timings`); "-" when the phase had
    under two steps (the contention's timed window passed inside a stall). None when no
    scenario changed its links.
    """
    rows = [(s, m, r) for s, ms in results.items() for m, r in ms.items() if "recovery_steps" in r]
    if not rows:
        return None
    t = Table(
        title="contention changes: settled s/iteration, steps to settle",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    for col in ["scenario", "method", "before", "during", "bound", "after", "on", "off"]:
        t.add_column(col, justify="left" if col in ("scenario", "method") else "right")
    for scenario, method, r in rows:
        steps = r.get("recovery_steps") or [None, None]
        settled = [r.get("contention_iter_s"), r.get("post_contention_iter_s")]
        t.add_row(
            scenario,
            method,
            _s(r.get("pre_contention_iter_s")),
            _s(settled[0]),
            _s(r.get("lower_bound_contended_s")),
            _s(settled[1]),
            *(_settle(k, v) for k, v in zip(steps, settled, strict=True)),
        )
    return t


def losses_table(results: dict[str, dict[str, Any]]) -> Table:
    """Per scenario and method, over the whole run: packets the tbf queues dropped on the rack
    uplinks and on the host links, and the TCP segments the hosts retransmitted and the
    retransmission timeouts among them (:func:`dssync.lab.cluster.losses`)."""
    t = Table(
        title="losses over each run: tbf drops, TCP retransmissions",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    cols = ["method", "uplink drops", "host drops", "retransmits", "timeouts"]
    for col in cols:
        t.add_column(col, justify="left" if col == "method" else "right")
    for scenario, methods in results.items():
        t.add_row(f"[bold]{scenario}[/bold]", *[""] * (len(cols) - 1))
        for method, r in methods.items():
            drops = r.get("tbf_drops", {})
            cells = [_drops(drops, "rack_uplink:"), _drops(drops, "host:")]
            cells += [str(r[k]) if k in r else "-" for k in ("tcp_retransmits", "tcp_timeouts")]
            t.add_row(f" {method}", *cells)
    return t


def _drops(drops: dict[str, int | None], kind: str) -> str:
    """Summed drops of one kind of link; "-" when none of them has a tbf (or none was read)."""
    counts = [v for k, v in drops.items() if k.startswith(kind) and v is not None]
    return str(sum(counts)) if counts else "-"


def _settle(steps: int | None, settled: float | None) -> str:
    """Steps to settle; "-" for a phase too short to have a settled pace (a stall outlasted it)."""
    if settled is None:
        return "-"
    return "never" if steps is None else str(steps)


def _s(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.3f}"


def _x(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


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
