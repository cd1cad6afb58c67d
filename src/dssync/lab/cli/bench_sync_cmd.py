"""`dssync bench-sync`: the cost of one averaging step against raw all_reduce and DDP."""

from __future__ import annotations

import click
from rich.table import Table

from dssync.comm.wire import WIRES
from dssync.lab.bench.sync_cost import measure, measure_scale
from dssync.lab.cli.output import console, fmt_ms, write_json
from dssync.lab.launch import spawn


@click.command("bench-sync")
@click.option(
    "--params",
    "numel",
    type=click.IntRange(1000),
    multiple=True,
    default=(10_000_000,),
    show_default=True,
    help="Parameters of the flat model (repeat the option to measure several sizes).",
)
@click.option(
    "--workers",
    "worker_counts",
    type=click.IntRange(2, 64),
    multiple=True,
    default=(4, 8),
    show_default=True,
    help="World sizes to measure (repeat the option).",
)
@click.option("--group-size", type=click.IntRange(1), default=2, show_default=True)
@click.option(
    "--steps", type=click.IntRange(1), default=40, show_default=True, help="Timed steps per method."
)
@click.option(
    "--bucket-mb",
    type=click.FloatRange(min=0.001),
    default=25.0,
    show_default=True,
    help="DS-Sync bucket size.",
)
@click.option(
    "--scale",
    is_flag=True,
    default=False,
    help="Many ranks, Shuffle(2) that never repeats: the averaging core against the old "
    "group-per-pair path (groups created after step 1, start-up, p50/p99 per step).",
)
@click.option(
    "--wire",
    "wires",
    type=click.Choice(WIRES),
    multiple=True,
    default=("fp32",),
    show_default=True,
    help="What DS-Sync sends (repeat the option to measure several in one run).",
)
@click.option(
    "--nonfinite",
    type=click.Choice(["raise", "spread"]),
    default="raise",
    show_default=True,
    help="The step's finiteness check: 'raise' (on, the default) or 'spread' (off, to time it).",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None)
def bench_sync(
    numel, worker_counts, group_size, steps, bucket_mb, scale, wires, nonfinite, json_path
) -> None:
    """Time one DS-Sync averaging step against a raw all_reduce on the same groups and DDP."""
    if scale:
        rows = []
        for n in numel:
            rows += _scale(n, worker_counts, steps, nonfinite)
        if json_path:
            write_json(json_path, rows)
        return
    for world in worker_counts:
        if group_size > world:
            raise click.BadParameter(f"--group-size {group_size} exceeds --workers {world}")
    rows = []
    for n in numel:
        size_rows = []
        for world in worker_counts:
            for wire in wires:
                console.print(f"measuring {world} workers, {n:,} parameters, wire {wire} ...")
                args = (n, group_size, steps, 0, bucket_mb, wire, nonfinite)
                size_rows.append(spawn(measure, world, args=args, timeout_s=1800)[0])
        _print_size(n, steps, size_rows)
        rows += size_rows
    if len(numel) > 1 or len(wires) > 1:
        _print_vs_exchange(rows, wires)
    if json_path:
        write_json(json_path, rows)


def _print_size(numel: int, steps: int, rows: list[dict]) -> None:
    table = Table(
        title=f"one synchronization step, {numel:,} parameters (median of {steps}, slowest rank)"
    )
    for col in [
        "workers",
        "wire",
        "MB sent",
        "encode",
        "raw all_reduce (group)",
        "raw all_reduce + divide",
        "DS-Sync step (group)",
        "overhead",
        "overhead IQR",
        "vs all_reduce + divide",
        "raw whole-buffer exchange",
        "vs exchange",
        "vs fp32 exchange",
        "DDP grad all-reduce",
        "DDP / DS-Sync",
    ]:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["world_size"]),
            r["wire"],
            f"{r['wire_bytes'] / 1e6:.1f}",
            fmt_ms(r["encode_s"]) if r["wire"] != "fp32" else "-",
            fmt_ms(r["raw_s"]),
            fmt_ms(r["raw_avg_s"]),
            fmt_ms(r["dssync_s"]),
            f"{r['overhead']:.3f}x",
            f"{r['overhead_q1']:.2f}-{r['overhead_q3']:.2f}x",
            f"{r['overhead_vs_raw_avg']:.3f}x",
            fmt_ms(r["raw_exchange_s"]),
            f"{r['overhead_vs_raw_exchange']:.3f}x",
            f"{r['overhead_vs_fp32_exchange']:.3f}x",
            fmt_ms(r["ddp_s"]),
            f"{r['ddp_s'] / r['dssync_s']:.2f}x",
        )
    console.print(table)
    console.print(
        "overhead: median over steps of (DS-Sync step / raw all_reduce), timed back to back; "
        "'vs all_reduce + divide' is the same against an all_reduce followed by the division; "
        "'vs exchange' against one whole-buffer send/recv with the partner in the same wire "
        "format, then the mean (fp32: add and halve; compressed: encode with error feedback, "
        "decode, mean), 'vs fp32 exchange' against the fp32 one; 'MB sent' is one rank's "
        "message per pair step in the wire format, 'encode' that format's own compute per step "
        "(encode with error feedback, decode, mean)"
    )


def _print_vs_exchange(rows: list[dict], wires: tuple[str, ...]) -> None:
    """One line per size and world size: each wire's DS-Sync step / its raw exchange."""
    table = Table(title="DS-Sync step / raw whole-buffer exchange in the same wire format")
    table.add_column("parameters", justify="right")
    table.add_column("workers", justify="right")
    for wire in wires:
        table.add_column(wire, justify="right")
    lines: dict[tuple[int, int], dict[str, str]] = {}
    for r in rows:
        ratio = f"{r['overhead_vs_raw_exchange']:.3f}x"
        lines.setdefault((r["numel"], r["world_size"]), {})[r["wire"]] = ratio
    for (n, world), by_wire in lines.items():
        table.add_row(f"{n:,}", str(world), *(by_wire.get(w, "-") for w in wires))
    console.print(table)


def _scale(numel: int, worker_counts: tuple[int, ...], steps: int, nonfinite: str) -> list[dict]:
    rows = []
    for world in worker_counts:
        console.print(
            f"measuring {world} workers, {numel:,} parameters, Shuffle(2), {steps} steps ..."
        )
        rows.append(
            spawn(
                measure_scale,
                world,
                args=(numel, steps, 0, nonfinite),
                timeout_s=3600,
                collective_timeout_s=600,
            )[0]
        )
    table = Table(
        title=f"Shuffle(2) at scale, {numel:,} parameters, {steps} steps (slowest rank per step)"
        + ("" if nonfinite == "raise" else f", nonfinite={nonfinite}")
    )
    for col in [
        "workers",
        "path",
        "groups made after step 1",
        "start-up",
        "p50 per step",
        "p99 per step",
    ]:
        table.add_column(col, justify="right")
    for r in rows:
        for path, label in (("new", "exchange (now)"), ("old", "group per pair + all_reduce")):
            table.add_row(
                str(r["world_size"]),
                label,
                str(r[f"{path}_groups_after_step1"]),
                f"{r[f'{path}_start_s']:.2f} s",
                fmt_ms(r[f"{path}_p50_s"]),
                fmt_ms(r[f"{path}_p99_s"]),
            )
        table.add_row(
            str(r["world_size"]),
            "step tag alone",
            "-",
            "-",
            fmt_ms(r["tag_p50_s"]),
            fmt_ms(r["tag_p99_s"]),
        )
    console.print(table)
    return rows
