"""The plot of ``dssync plan --table --plot``: predictions against workers, per topology."""

from __future__ import annotations

import math
from pathlib import Path

from dssync.lab.plan.cost import METHODS
from dssync.lab.plan.tables import Plan

LABELS = {
    "ddp": "ddp",
    "hierarchical": "hierarchical",
    "dssync": "shuffle (dssync)",
    "dssync-topo": "topology-aware (dssync-topo)",
    "dssync-topo overlapped": "overlapped (dssync-topo)",
}
CONSENSUS = ("dssync", "dssync-topo")


def plan_plot(tables: dict[str, list[Plan]], path: str | Path) -> None:
    """Per topology, two panels: ms per iteration of each method and DS-Sync's steps to
    consensus, against workers (log2). ``tables`` maps a name to its plans, one per worker count
    (those of :func:`dssync.lab.plan.tables.scale_plans`); steps that never converge are left out of
    their line and named in its legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter, NullLocator

    per_row = 2 if len(tables) > 1 else 1
    rows = math.ceil(len(tables) / per_row)
    fig, axes = plt.subplots(
        rows, 2 * per_row, figsize=(8 * per_row, 3.4 * rows + 0.8), squeeze=False
    )
    color = {m: f"C{i}" for i, m in enumerate(METHODS)}
    first = next(iter(tables.values()))[0]
    for k, plans in enumerate(tables.values()):
        left, right = (
            axes[k // per_row][2 * (k % per_row)],
            axes[k // per_row][2 * (k % per_row) + 1],
        )
        workers = [p.spec.world_size for p in plans]
        for m in METHODS:
            ms = [
                next(p.iter_s for p in plan.predictions if p.method == m) * 1000 for plan in plans
            ]
            left.plot(workers, ms, marker="o", markersize=3, color=color[m], label=LABELS[m])
        for m in CONSENSUS:
            steps = [plan.steps[m] for plan in plans]
            finite = [(n, s) for n, s in zip(workers, steps, strict=True) if not math.isinf(s)]
            never = [str(n) for n, s in zip(workers, steps, strict=True) if math.isinf(s)]
            label = LABELS[m] + (f"; never at {', '.join(never)}" if never else "")
            xs, ys = [n for n, _ in finite], [s for _, s in finite]
            right.plot(xs, ys, marker="o", markersize=3, color=color[m], label=label)
        name = plans[0].spec.name
        left.set_title(f"{name}: ms per iteration", fontsize=9)
        right.set_title(f"{name}: steps to consensus (1e-3)", fontsize=9)
        right.legend(fontsize=7)
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(workers, [str(n) for n in workers])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(LogFormatter())  # 600, not 6 x 10^2
            ax.yaxis.set_minor_formatter(
                LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5))
            )
            ax.set_xlabel("workers", fontsize=8)
            ax.tick_params(which="both", labelsize=7)
            ax.grid(alpha=0.3)
    for ax in axes.flat[2 * len(tables) :]:
        ax.set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    height = fig.get_figheight()
    fig.suptitle(
        f"dssync plan: {first.params:,} parameters, {first.compute_s * 1000:g} ms compute "
        "(predicted, no network used)",
        y=1 - 0.1 / height,
        va="top",
        fontsize=10,
    )
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.35 / height),
        ncol=len(METHODS),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / height))
    fig.savefig(path, dpi=110)
    plt.close(fig)
