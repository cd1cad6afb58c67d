"""`dssync compare`: several methods, several seeds, one report folder."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from dssync.cli.output import console, write_json
from dssync.cli.train_cmd import training_options
from dssync.experiments.compare import compare
from dssync.experiments.runners import runner_for
from dssync.methods import get_method, help_text, parse_methods
from dssync.report.files import plot_metric, write_csv, write_evals_csv, write_markdown
from dssync.report.summary import summarize, summary_table
from dssync.train import TrainConfig
from dssync.train.validate import validate

DEVICES = ("auto", "cpu", "cuda")


def _methods(ctx, param, value: str) -> list[str]:
    return parse_methods(value)  # an unknown name is a UsageError listing the known ones


def _key_values(ctx, param, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE; write e.g. hidden=2048")
        out[key.strip()] = value.strip()
    return out


@click.command()
@training_options
@click.option(
    "--methods",
    default="all",
    show_default=True,
    callback=_methods,
    help=f"Comma-separated methods, or 'all' (every one but variants). {help_text()}.",
)
@click.option(
    "--seeds", type=click.IntRange(1, 20), default=3, show_default=True, help="Seeds 0..N-1."
)
@click.option(
    "--target",
    type=float,
    default=None,
    help="Metric value for time-to-target (default: BSP's mean final metric).",
)
@click.option(
    "--cluster",
    "cluster",
    default=None,
    help="Run on an emulated cluster built from this cluster spec (shipped name or file); needs root.",
)
@click.option(
    "--device",
    type=click.Choice(DEVICES),
    default="auto",
    show_default=True,
    help="Where each worker trains (auto: CUDA when present).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="reports/compare",
    show_default=True,
    help="Report folder (summary.md, PNG plots, CSV logs, summary.json).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the summary JSON here.",
)
@click.option(
    "--eval-every",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Evaluate the averaged model every N steps (0: once per epoch); finer time-to-target.",
)
@click.option(
    "--workload-option",
    "workload_options",
    multiple=True,
    callback=_key_values,
    metavar="KEY=VALUE",
    help="A workload setting, e.g. hidden=2048 or depth=16 (repeatable).",
)
def compare_cmd(
    workload,
    workers,
    group_size,
    schedule,
    repeat,
    replan_every,
    epochs,
    batch_size,
    lr,
    lr_schedule,
    data_dir,
    timeout_s,
    max_steps,
    swa_start,
    swa_lr,
    quiet,
    methods,
    seeds,
    target,
    cluster,
    device,
    out_dir,
    json_path,
    eval_every,
    workload_options,
) -> None:
    """Train WORKLOAD with each method and seed; write a report folder and print the summary."""
    base = TrainConfig(
        workload=workload,
        schedule=schedule,
        group_size=group_size,
        repeat=repeat,
        replan_every=replan_every,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        lr_schedule=lr_schedule,
        data_dir=data_dir,
        timeout_s=timeout_s,
        max_steps=max_steps,
        swa_start=0.75 if swa_start is None else swa_start,
        swa_lr=swa_lr,
        progress=not quiet,
        workload_options=workload_options,
        eval_every=eval_every,
        device=device,
    )
    for m in methods:
        validate(replace(base, sync=m), workers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def done(method: str, seed: int, s: dict) -> None:
        console.print(
            f"  {method:<13} seed {seed}: {s['metric_name']} {s['final_metric']:.4f}, "
            f"{s['steps'] / max(s['train_time_s'], 1e-9):.1f} it/s, sync {s['sync_time_s'] * 1000:.2f} ms/it"
        )

    with runner_for(cluster, workers) as runner:
        console.print(
            f"comparing {', '.join(methods)} on {workload}, {seeds} seed(s), {runner.where}"
        )
        runs = compare(base, methods, list(range(seeds)), runner, on_run=done)
    bsp = next((m for m in methods if get_method(m).name == "bsp"), "bsp")  # "ddp" too
    summary = summarize(runs, target, reference=bsp)
    meta = {
        "workload": workload,
        "workers": runner.workers,
        "seeds": list(range(seeds)),
        "epochs": epochs,
        "where": runner.where,
    }
    write_csv(out / "steps.csv", runs)
    write_evals_csv(out / "evals.csv", runs)
    metric = summary["methods"][methods[0]]["metric_name"]
    plot_metric(
        out / "metric_vs_time.png",
        out / "metric_vs_step.png",
        runs,
        metric,
        f"{workload}: {metric} of the averaged model",
    )
    write_markdown(out / "summary.md", summary, meta)
    write_json(out / "summary.json", {**summary, "meta": meta})
    if json_path:
        write_json(json_path, {**summary, "meta": meta})
    console.print(summary_table(summary))
    console.print(f"report written to {out}/summary.md")
