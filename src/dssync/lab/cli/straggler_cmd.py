"""`dssync bench-straggler`: one slow worker, and how much it slows the others under each method."""

from __future__ import annotations

import click
from rich.table import Table

from dssync.lab.cli.output import console, fmt_ms, write_json
from dssync.lab.experiments.straggler import DEFAULT_METHODS, StragglerSettings, straggler_bench
from dssync.lab.methods import choices, parse_methods
from dssync.lab.report.tables import compact_table
from dssync.lab.workloads import WORKLOADS


@click.command("bench-straggler")
@click.option(
    "--workload", type=click.Choice(sorted(WORKLOADS)), default="digits", show_default=True
)
@click.option("--workers", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--group-size", type=click.IntRange(1), default=2, show_default=True)
@click.option("--slow-rank", type=click.IntRange(0), default=0, show_default=True)
@click.option(
    "--slow-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=20.0,
    show_default=True,
    help="Sleep added to every step of --slow-rank.",
)
@click.option("--steps", type=click.IntRange(5), default=60, show_default=True)
@click.option(
    "--methods",
    default=",".join(DEFAULT_METHODS),
    show_default=True,
    help=f"Comma-separated, from: {', '.join(choices())}.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None)
def bench_straggler(
    workload, workers, group_size, slow_rank, slow_ms, steps, methods, json_path
) -> None:
    """Slowdown of the other workers' iteration time when one worker is slow, DS-Sync against DDP."""
    if group_size > workers:
        raise click.BadParameter(
            f"{group_size} exceeds --workers {workers}; use 1 to {workers}",
            param_hint="--group-size",
        )
    settings = StragglerSettings(
        workload=workload,
        workers=workers,
        group_size=group_size,
        slow_rank=slow_rank,
        slow_ms=slow_ms,
        steps=steps,
        methods=tuple(parse_methods(methods)),
    )
    rows = straggler_bench(settings)
    title = (
        f"{workload}, {workers} workers, rank {slow_rank} +{slow_ms:g} ms/step, {steps} steps "
        "(mean iteration time of the other ranks)"
    )
    console.print(straggler_table(rows, title))
    if json_path:
        write_json(json_path, rows)


def straggler_table(rows: list[dict], title: str) -> Table:
    """One row per method: the others' iteration time without and with the straggler."""
    table = compact_table(
        title, ["method", "without straggler", "with straggler", "added", "slowdown"]
    )
    for r in rows:
        table.add_row(
            r["method"],
            fmt_ms(r["others_iter_s"]),
            fmt_ms(r["others_iter_straggler_s"]),
            f"{r['added_ms']:.2f} ms",
            f"{r['slowdown']:.2f}x",
        )
    return table
