"""`dssync plan`: predicted iteration time and steps to consensus of each method on a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from dssync.errors import UsageError
from dssync.plan.clusters import cluster_for, to_toml
from dssync.plan.tables import SCALES, make_plan, plan_table, scale_table

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
    help=f"Tables for the shipped topologies and the generated fabrics at {', '.join(map(str, SCALES))} workers.",
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
    validate_path,
    rates,
    write_topology,
) -> None:
    """Predict each method's iteration time and DS-Sync's steps to consensus (no network used)."""
    out = Console(width=80)
    latency_s = latency_us * 1e-6
    modes = [
        m
        for m, on in (("--topology", topology), ("--table", scales), ("--validate", validate_path))
        if on
    ]
    if len(modes) != 1:
        raise UsageError(
            f"give exactly one of --topology, --table or --validate (got "
            f"{', '.join(modes) or 'none'}); e.g. --topology s2-inter-rack"
        )
    if workers is not None and not topology:
        raise UsageError("--workers scales a --topology; drop it, or add --topology NAME")
    if rates != "file" and not validate_path:
        raise UsageError("--rates applies to --validate only; drop it, or add --validate FILE.json")
    if validate_path:
        from dssync.plan.validate import validate_table

        out.print(validate_table(_read_json(validate_path), rates, latency_s))
        return
    if scales:
        for name in TABLE_TOPOLOGIES:
            out.print(scale_table(name, params, compute_ms / 1000, latency_s=latency_s))
        return
    spec = cluster_for(topology, workers)
    if write_topology:
        Path(write_topology).write_text(to_toml(spec))
    result = make_plan(spec, params, compute_ms / 1000, latency_s)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        out.print(plan_table(result))


def _read_json(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(
            f"--validate {path}: no such file; give the JSON of `dssync bench --json`"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(
            f"--validate {path}: not JSON ({e}); give the file `dssync bench --json` wrote"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise UsageError(
            f"--validate {path}: no 'results' table; give the file `dssync bench --json` wrote"
        )
    return data
