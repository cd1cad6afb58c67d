"""``dssync cluster``: build, tear down, and run commands on an emulated cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from dssync.lab.cluster import (
    Cluster,
    ClusterError,
    ClusterSpec,
    ClusterSpecError,
    Scenario,
    load_cluster,
)
from dssync.lab.cluster.names import check_prefix
from dssync.lab.cluster.netns import STATE_DIR, list_prefixes, remove_prefix


def _load(spec_name: str) -> ClusterSpec:
    try:
        spec = load_cluster(spec_name)
    except ClusterSpecError as exc:
        raise click.BadParameter(str(exc), param_hint="CLUSTER_SPEC") from None
    return spec


def _prefix(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            check_prefix(value)
        except ClusterError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def _describe(cluster: Cluster) -> str:
    spec = cluster.spec
    lines = [
        f"cluster {cluster.prefix} ({spec.name}): {spec.num_hosts} hosts, "
        f"{spec.world_size} workers, switch namespace {cluster.switch_ns}"
    ]
    for h in range(spec.num_hosts):
        lines.append(
            f"  host {h} rack {spec.rack_of_host(h)}: netns {cluster.host_ns(h)} "
            f"{cluster.host_ifname(h)} {cluster.address_of(h)} "
            f"{spec.host_rate(h):g} Mbit/s"
        )
    if spec.has_core:
        lines.append(f"  rack uplinks: {spec.rack_uplink_mbit or 'unshaped'} Mbit/s")
    return "\n".join(lines)


@click.group(name="cluster")
def cluster() -> None:
    """Emulated cluster: network namespaces with rate-limited links (needs root)."""


@cluster.command()
@click.argument("cluster_spec")
@click.option(
    "--prefix", default=None, callback=_prefix, help="Name prefix, e.g. dss01 (default: random)."
)
def up(cluster_spec: str, prefix: str | None) -> None:
    """Build the cluster described by CLUSTER_SPEC (a shipped name or a .toml path) and keep it."""
    spec = _load(cluster_spec)
    try:
        built = Cluster(spec, prefix=prefix).up()
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from None
    built.save_state()
    click.echo(_describe(built))
    click.echo(f"tear down with: dssync cluster down {built.prefix}")


@cluster.command()
@click.argument("prefix", required=False)
@click.option("--all", "all_", is_flag=True, help="Remove every dss* cluster on this machine.")
def down(prefix: str | None, all_: bool) -> None:
    """Remove cluster PREFIX (namespaces, links, qdiscs), or all of them with --all."""
    if bool(prefix) == all_:
        raise click.UsageError("give a PREFIX (see `ip netns list`) or --all, not both or neither")
    try:
        prefixes = list_prefixes() if all_ else [prefix]
        for p in prefixes:
            removed = remove_prefix(p)
            click.echo(f"removed {p}: {len(removed)} namespaces")
    except ClusterError as exc:
        if "prefix" in str(exc) and "not valid" in str(exc):
            raise click.BadParameter(str(exc), param_hint="PREFIX") from None
        raise click.ClickException(str(exc)) from None


@cluster.command(context_settings={"ignore_unknown_options": True})
@click.argument("cluster_spec")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--prefix", default=None, callback=_prefix, help="Name prefix, e.g. dss01 (default: random)."
)
@click.option(
    "--timeout",
    "timeout_s",
    default=3600.0,
    show_default=True,
    help="Seconds before all workers are killed.",
)
@click.option(
    "--duration",
    "duration_s",
    type=float,
    default=None,
    help="Run length in seconds for events given as at_fraction.",
)
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Write each host's torchrun output (its workers' included) to LOG_DIR/host<h>.log.",
)
def run(
    cluster_spec: str,
    command: tuple[str, ...],
    prefix: str | None,
    timeout_s: float,
    duration_s: float | None,
    log_dir: Path | None,
) -> None:
    """Build CLUSTER_SPEC, run COMMAND on every worker (one torchrun per host), tear down.

    Each host runs `torchrun --nnodes H --nproc-per-node R --rdzv-backend c10d
    --rdzv-endpoint <host 0>:PORT --rdzv-id ID COMMAND` in its namespace.

    Example: dssync cluster run s2-inter-rack -- python train.py
    """
    spec = _load(cluster_spec)
    if any(e.at_s is None for e in spec.events) and duration_s is None:
        raise click.UsageError(
            f"{spec.source} has events at a fraction of the run; pass --duration SECONDS"
        )
    try:
        with Cluster(spec, prefix=prefix) as built:
            click.echo(_describe(built), err=True)
            with Scenario(built.set_rate, spec.events, duration_s):
                result = built.run(list(command), timeout_s=timeout_s, log_dir=log_dir)
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted; cluster removed", err=True)
        sys.exit(130)
    if not result.ok:
        click.echo(result.summary(), err=True)
    # sys.exit, not ctx.exit: the code must survive click's standalone_mode=False.
    sys.exit(result.exit_code)


@cluster.command(name="list")
def list_() -> None:
    """List the clusters present on this machine."""
    for p in list_prefixes():
        state = STATE_DIR / f"{p}.json"
        source = json.loads(state.read_text()).get("source", "?") if state.is_file() else "?"
        click.echo(f"{p}\t{source}")


if __name__ == "__main__":
    sys.exit(cluster())
