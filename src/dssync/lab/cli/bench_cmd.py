"""`dssync bench`: DDP, hierarchical all-reduce, DS-Sync and topology-aware DS-Sync on the emulated cluster."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from dssync.comm.transport import LARGE_GROUPS
from dssync.lab.bench.cluster_worker import Burn
from dssync.lab.cli.options import dssync_options
from dssync.lab.cli.output import console, provenance, write_json
from dssync.lab.config import TrainConfig
from dssync.lab.experiments.cluster_bench import METHODS, SCENARIOS, BenchSettings, run_bench
from dssync.lab.methods import for_method, get_method, help_text, split_label
from dssync.lab.report.bench import bench_plot, bench_table, losses_table, recovery_table
from dssync.schedules.topology import SPREAD


def _known(ctx: click.Context, param: click.Parameter, names: tuple[str, ...]) -> tuple[str, ...]:
    for name in names:
        base, _ = split_label(name)  # an unknown name or option is a UsageError naming the fix
        get_method(name)
        for_method(TrainConfig(sync=base), name)  # an option the method does not take, too
    return names


@click.command("bench")
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    default=SCENARIOS,
    show_default=True,
    help="Cluster spec names or files (repeat the option).",
)
@click.option(
    "--method",
    "methods",
    multiple=True,
    default=METHODS,
    show_default=True,
    callback=_known,
    help=f"Repeat the option; NAME:KEY=VALUE sets options of one run (dssync-topo:every=4). {help_text()}.",
)
@click.option(
    "--params",
    type=click.IntRange(1000),
    default=10_000_000,
    show_default=True,
    help="Parameters of the flat model.",
)
@click.option("--steps", type=click.IntRange(2), default=30, show_default=True)
@click.option(
    "--dynamic-steps",
    type=click.IntRange(2),
    default=120,
    show_default=True,
    help="Steps for scenarios with timed link changes (S4).",
)
@click.option(
    "--repeat",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Repeat length of the shuffled schedules and dssync-topo's re-planning interval (steps).",
)
@click.option("--warmup", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--probe/--no-probe",
    default=True,
    show_default=True,
    help="Bandwidth probe at the start of dssync-topo.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(10),
    default=600.0,
    show_default=True,
    help="Seconds one run may take.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default="dssync-bench.png",
    show_default=True,
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where worker logs and timings go (default: a temporary folder).",
)
@click.option(
    "--device",
    type=click.Choice(("auto", "cpu", "cuda")),
    default="auto",
    show_default=True,
    help="Where each worker keeps its model (auto: CUDA when present).",
)
@click.option(
    "--compute-ms",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Compute per step (ms), so averaging can hide behind compute.",
)
@click.option(
    "--compute-kind",
    type=click.Choice(Burn.KINDS),
    default="cpu",
    show_default=True,
    help="cpu: matrix work on the shared cores; idle: a wait that leaves them free, as a GPU's "
    "compute does (each real host has its own cores; the emulated hosts share this machine's).",
)
@dssync_options
def bench(
    scenarios,
    methods,
    params,
    steps,
    dynamic_steps,
    repeat,
    warmup,
    probe,
    timeout_s,
    json_path,
    plot_path,
    out_dir,
    device,
    compute_ms,
    compute_kind,
    options,
) -> None:
    """Run each method on each scenario of the emulated cluster (needs root and iproute2)."""
    if warmup >= steps:
        raise click.BadParameter(f"--warmup {warmup} must be below --steps {steps}")
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="dssync-bench-"))
    settings = BenchSettings(
        params=params,
        steps=steps,
        dynamic_steps=dynamic_steps,
        warmup=warmup,
        repeat=repeat,
        probe=probe,
        timeout_s=timeout_s,
        out_dir=out,
        device=device,
        compute_ms=compute_ms,
        compute_kind=compute_kind,
        options=options,
    )
    failed: dict[str, dict[str, str]] = {}
    results = run_bench(
        list(scenarios), list(methods), settings, log=lambda m: console.print(m), failed=failed
    )
    if json_path:  # first: a failure in the tables or the plot must not lose the runs
        write_json(
            json_path,
            {
                "meta": provenance(),
                "settings": {
                    **vars(settings),
                    "out_dir": str(out),
                    "spread": SPREAD,
                    "encoded": LARGE_GROUPS,
                },
                "results": results,
                "failed": failed,
            },
        )
    console.print(bench_table(results, params, compute_ms, compute_kind))
    changes = recovery_table(results)
    if changes is not None:
        console.print(changes)
    console.print(losses_table(results))
    bench_plot(results, plot_path)
    console.print(f"plot: {plot_path}; worker logs: {out}")
    if failed:
        runs = [f"{s} / {m}" for s, ms in failed.items() for m in ms]
        raise click.ClickException(
            f"{len(runs)} run(s) failed ({', '.join(runs)}); the others are in the tables above"
        )
