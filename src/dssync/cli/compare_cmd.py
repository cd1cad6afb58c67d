"""`dssync compare`: several methods, several seeds, one report folder."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
from rich.table import Table

from dssync.cli.output import console, write_json
from dssync.cli.train_cmd import training_options
from dssync.report.compare import compare, runner_for, summarize
from dssync.report.files import plot_metric, write_csv, write_evals_csv, write_markdown
from dssync.train import TrainConfig
from dssync.train.validate import validate
from dssync.train.factory import STRATEGIES


def _methods(ctx, param, value: str) -> list[str]:
    if value.strip() == "all":
        return list(STRATEGIES)
    names = [m.strip() for m in value.split(",") if m.strip()]
    unknown = [m for m in names if m not in STRATEGIES]
    if unknown or not names:
        raise click.BadParameter(f"unknown method(s) {unknown}; choose from {', '.join(STRATEGIES)}")
    return names


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
@click.option("--methods", default="all", show_default=True, callback=_methods,
              help=f"Comma-separated methods: {', '.join(STRATEGIES)} (or 'all').")
@click.option("--seeds", type=click.IntRange(1, 20), default=3, show_default=True, help="Seeds 0..N-1.")
@click.option("--target", type=float, default=None,
              help="Metric value for time-to-target (default: BSP's mean final metric).")
@click.option("--cluster", "topology", default=None,
              help="Run on an emulated cluster built from this topology (shipped name or file); needs root.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="reports/compare", show_default=True,
              help="Report folder (summary.md, PNG plots, CSV logs, summary.json).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the summary JSON here.")
@click.option("--eval-every", type=click.IntRange(0), default=0, show_default=True,
              help="Evaluate the averaged model every N steps (0: once per epoch); finer time-to-target.")
@click.option("--workload-option", "workload_options", multiple=True, callback=_key_values, metavar="KEY=VALUE",
              help="A workload setting, e.g. hidden=2048 or depth=16 (repeatable).")
def compare_cmd(workload, workers, group_size, schedule, period, epochs, batch_size, lr, lr_schedule, data_dir,
                timeout_s, max_steps, swa_start, swa_lr, quiet, methods, seeds, target, topology, out_dir,
                json_path, eval_every, workload_options) -> None:
    """Train WORKLOAD with each method and seed; write a report folder and print the summary."""
    base = TrainConfig(workload=workload, schedule=schedule, group_size=group_size, period=period, epochs=epochs,
                       batch_size=batch_size, lr=lr, lr_schedule=lr_schedule, data_dir=data_dir, timeout_s=timeout_s,
                       max_steps=max_steps, swa_start=0.75 if swa_start is None else swa_start, swa_lr=swa_lr,
                       progress=not quiet,
                       workload_options=workload_options, eval_every=eval_every)
    for m in methods:
        validate(replace(base, sync=m), workers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def done(method: str, seed: int, s: dict) -> None:
        console.print(f"  {method:<13} seed {seed}: {s['metric_name']} {s['final_metric']:.4f}, "
                      f"{s['steps'] / max(s['train_time_s'], 1e-9):.1f} it/s, sync {s['sync_time_s'] * 1000:.2f} ms/it")

    with runner_for(topology, workers) as runner:
        console.print(f"comparing {', '.join(methods)} on {workload}, {seeds} seed(s), {runner.where}")
        runs = compare(base, methods, list(range(seeds)), runner, on_run=done)
    summary = summarize(runs, target)
    meta = {"workload": workload, "workers": runner.workers, "seeds": list(range(seeds)), "epochs": epochs,
            "where": runner.where}
    write_csv(out / "steps.csv", runs)
    write_evals_csv(out / "evals.csv", runs)
    metric = summary["methods"][methods[0]]["metric_name"]
    plot_metric(out / "metric_vs_time.png", out / "metric_vs_step.png", runs, metric,
                f"{workload}: {metric} of the averaged model")
    write_markdown(out / "summary.md", summary, meta)
    write_json(out / "summary.json", {**summary, "meta": meta})
    if json_path:
        write_json(json_path, {**summary, "meta": meta})
    console.print(_table(summary))
    console.print(f"report written to {out}/summary.md")


def _table(summary: dict) -> Table:
    t = Table(title=f"target {summary['target']:.4f} ({summary['target_source']})")
    for col in ["method", "final (mean ± std)", "SWA", "time to target", "it/s", "sync/it", "consensus"]:
        t.add_column(col, justify="left" if col == "method" else "right")
    for name, m in summary["methods"].items():
        ttt = "n/a" if m["time_to_target_s"] is None else f"{m['time_to_target_s']:.2f} s"
        swa = "n/a" if m["swa_metric"] is None else f"{m['swa_metric']:.4f}"
        t.add_row(name, f"{m['final_metric']:.4f} ± {m['final_metric_std']:.4f}", swa, ttt,
                  f"{m['iterations_per_s']:.1f}", f"{m['sync_time_s'] * 1000:.2f} ms", f"{m['consensus_distance']:.2e}")
    return t
