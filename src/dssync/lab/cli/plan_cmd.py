"""`dssync plan`: predicted iteration time and steps to consensus of each method on a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from dssync.errors import UsageError
from dssync.lab.plan.clusters import cluster_for, to_toml
from dssync.lab.plan.tables import SCALES, make_plan, plan_table, scale_plans, scale_table_of
from dssync.lab.workloads import WORKLOADS

TABLE_TOPOLOGIES = (
    "s1-homogeneous",
    "s2-inter-rack",
    "s3-slow-host",
    "s4-dynamic",
    "fat-tree",
    "rack-spine",
)


@click.command("plan")
@click.option(
    "--topology",
    default=None,
    metavar="FILE|NAME",
    help="A topology file, a shipped name (s2-inter-rack), or fat-tree / rack-spine.",
)
@click.option(
    "--params",
    type=click.IntRange(1),
    default=4_000_000,
    show_default=True,
    help="Parameters of the model (float32).",
)
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=None,
    help="Scale the topology to N workers: same rack size and link rates, more racks.",
)
@click.option(
    "--compute-ms",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Compute time of one iteration (forward, backward, optimizer step).",
)
@click.option(
    "--latency-us",
    type=click.FloatRange(0),
    default=50.0,
    show_default=True,
    help="Latency of one message through one switch (an assumption: TCP on Ethernet).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON instead of a table.")
@click.option(
    "--table",
    "scales",
    is_flag=True,
    help=f"Tables for the shipped cluster specs and the generated fabrics at {', '.join(map(str, SCALES))} workers.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.png",
    help="With --table: also plot iteration time and steps to consensus against workers (PNG).",
)
@click.option(
    "--validate",
    "validate_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.json",
    help="Predicted against measured for a `dssync bench --json` file.",
)
@click.option(
    "--rates",
    type=click.Choice(["file", "probe"]),
    default="file",
    show_default=True,
    help="With --validate: link rates from the topology file or from the bench's probe.",
)
@click.option(
    "--host-json",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE.json",
    help="With --validate: the CPU's cost per byte from a `dssync bench-sync --json` file.",
)
@click.option(
    "--measure-local",
    type=click.IntRange(2, 64),
    default=None,
    metavar="N",
    help="Run `dssync train` with N local ranks (dssync, bsp) and bench-sync; measured against "
    "predicted averaging time on this machine.",
)
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=30,
    show_default=True,
    help="With --measure-local: training steps per run.",
)
@click.option(
    "--workload",
    type=click.Choice(sorted(WORKLOADS)),
    default="digits",
    show_default=True,
    help="With --measure-local: the workload trained (a tiny model).",
)
@click.option(
    "--write-topology",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the (scaled or generated) topology file here.",
)
def plan(
    topology,
    params,
    workers,
    compute_ms,
    latency_us,
    as_json,
    scales,
    plot_path,
    validate_path,
    rates,
    host_json,
    measure_local,
    steps,
    workload,
    write_topology,
) -> None:
    """Predict each method's iteration time and DS-Sync's steps to consensus (no network used)."""
    out = Console(width=80)
    latency_s = latency_us * 1e-6
    if plot_path and not scales:
        raise click.UsageError("--plot needs --table; add --table, or drop --plot")
    modes = [
        m
        for m, on in (
            ("--topology", topology),
            ("--table", scales),
            ("--validate", validate_path),
            ("--measure-local", measure_local),
        )
        if on
    ]
    if len(modes) != 1:
        raise UsageError(
            f"give exactly one of --topology, --table, --validate or --measure-local (got "
            f"{', '.join(modes) or 'none'}); e.g. --topology s2-inter-rack"
        )
    if workers is not None and not topology:
        raise UsageError("--workers scales a --topology; drop it, or add --topology NAME")
    if rates != "file" and not validate_path:
        raise UsageError("--rates applies to --validate only; drop it, or add --validate FILE.json")
    if host_json and not validate_path:
        raise UsageError("--host-json applies to --validate only; drop it, or add --validate FILE")
    if (steps != 30 or workload != "digits") and not measure_local:
        raise UsageError(
            "--steps and --workload apply to --measure-local only; add --measure-local N"
        )
    if measure_local:
        from dssync.lab.plan.local import local_table
        from dssync.lab.plan.local import measure_local as measure

        run = measure(measure_local, steps, workload, latency_s)
        if as_json:
            click.echo(json.dumps(run.as_dict(), indent=2))
        else:
            out.print(local_table(run))
        return
    if validate_path:
        from dssync.lab.plan.validate import host_cost, validate_table

        data = _read_json(validate_path)
        host = host_cost(_read_json(host_json, "bench-sync", table=False), 8) if host_json else 0.0
        out.print(validate_table(data, rates, latency_s, host))
        return
    if scales:
        tables = {}
        for name in TABLE_TOPOLOGIES:
            tables[name] = scale_plans(name, params, compute_ms / 1000, SCALES, latency_s)
            out.print(scale_table_of(tables[name]))
        if plot_path:
            from dssync.lab.report.plan_plot import plan_plot

            plan_plot(tables, plot_path)
            click.echo(f"plot written to {plot_path}")
        return
    spec = cluster_for(topology, workers)
    if write_topology:
        Path(write_topology).write_text(to_toml(spec))
    result = make_plan(spec, params, compute_ms / 1000, latency_s)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        out.print(plan_table(result))


def _read_json(path: str, command: str = "bench", table: bool = True) -> Any:
    """The JSON that ``dssync <command> --json`` wrote at ``path``; bad files are a UsageError."""
    flag = "--validate" if command == "bench" else "--host-json"
    try:
        data = json.loads(Path(path).read_text())
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(
            f"{flag} {path}: no such file; give the JSON of `dssync {command} --json`"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(
            f"{flag} {path}: not JSON ({e}); give the file `dssync {command} --json` wrote"
        ) from None
    if table and (not isinstance(data, dict) or not isinstance(data.get("results"), dict)):
        raise UsageError(
            f"{flag} {path}: no 'results' table; give the file `dssync {command} --json` wrote"
        )
    return data
