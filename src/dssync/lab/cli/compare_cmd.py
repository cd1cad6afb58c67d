"""`dssync compare`: several methods, several seeds, one report folder."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from dssync.lab.cli.options import training_options
from dssync.lab.cli.output import console, provenance, write_json
from dssync.lab.experiments.compare import compare
from dssync.lab.experiments.runners import runner_for
from dssync.lab.methods import DEFAULT_METHODS, for_method, get_method, help_text, parse_methods
from dssync.lab.report.files import plot_metric, write_csv, write_evals_csv, write_markdown
from dssync.lab.report.summary import summarize, summary_table
from dssync.lab.train import TrainConfig
from dssync.lab.train.data import planned_steps, workload
from dssync.lab.train.validate import validate


def _methods(ctx, param, value: str) -> list[str]:
    return parse_methods(value)  # an unknown name is a UsageError listing the known ones


# compare reports the SWA ensemble of every run; without --swa-start it averages the last quarter.
SWA_START = 0.75
# Without --eval-every, each run evaluates its averaged model this many times, evenly: the
# resolution of the time to target (evaluations are not counted as training time).
EVAL_POINTS = 20


@click.command()
@training_options
@click.option(
    "--methods",
    default=",".join(DEFAULT_METHODS),
    show_default=True,
    callback=_methods,
    help="Comma-separated methods, or 'all' (every one but variants); a method with options of "
    "its own is NAME:KEY=VALUE[:KEY=VALUE], e.g. dssync-topo-local:every=16:wire=int8 beside "
    f"dssync-topo-local. {help_text()}.",
)
@click.option(
    "--seeds", type=click.IntRange(1, 20), default=3, show_default=True, help="Seeds 0..N-1."
)
@click.option(
    "--target",
    type=float,
    default=None,
    help="Quality every method must reach; time to it is the race (default: the workload's "
    "declared target).",
)
@click.option(
    "--stop-at-target",
    is_flag=True,
    help="End each run at its first evaluation at the target, as MLPerf Training does (shorter "
    "races; the final metric is then where each run stopped).",
)
@click.option(
    "--cluster",
    "cluster",
    default=None,
    help="Run on an emulated cluster built from this cluster spec (shipped name or file); needs root.",
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
def compare_cmd(
    cfg: TrainConfig,
    workers: int,
    methods: list[str],
    seeds: int,
    target: float | None,
    stop_at_target: bool,
    cluster: str | None,
    out_dir: str,
    json_path: str | None,
) -> None:
    """Train WORKLOAD with each method and seed; write a report folder and print the summary.

    With no options: BSP and DS-Sync, 3 seeds, the workload's own epochs, batch and rate. Each run
    also keeps an SWA average over its last quarter unless --swa-start says where to start.
    """
    base = cfg if cfg.swa_start is not None else replace(cfg, swa_start=SWA_START)
    for m in methods:
        validate(for_method(base, m), workers)
    source = "--target"
    if target is None:
        target = workload(cfg).quality_target()
        source = f"{cfg.workload}'s declared target"
    if target is None:
        if stop_at_target:
            raise click.UsageError(
                f"--stop-at-target needs a target and {cfg.workload} declares none "
                "with these options: pass --target"
            )
        console.print(f"{cfg.workload} declares no target: no time to target (pass --target)")
    elif stop_at_target:
        base = replace(base, stop_at=target)
    if cfg.swa_start is None:
        console.print(
            f"SWA on by default: weights averaged over each run's last {1 - SWA_START:.0%} "
            "(--swa-start)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def done(method: str, seed: int, s: dict) -> None:
        if "auto" in s:
            console.print(f"  {method:<13} seed {seed}: {s['auto']['reason']}")
        console.print(
            f"  {method:<13} seed {seed}: {s['metric_name']} {s['final_metric']:.4f}, "
            f"{s['steps'] / max(s['train_time_s'], 1e-9):.1f} it/s, sync {s['sync_time_s'] * 1000:.2f} ms/it"
        )

    def failed(method: str, seed: int, error: str) -> None:
        console.print(f"  {method:<13} seed {seed}: FAILED, counted as never reaching the target")
        console.print(f"    {error.strip()[-1500:]}")

    with runner_for(cluster, workers) as runner:
        if base.eval_every == 0:
            total = planned_steps(base, runner.workers)
            base = replace(base, eval_every=max(1, round(total / EVAL_POINTS)))
            console.print(f"  evaluating every {base.eval_every} of {total} steps (--eval-every)")
        console.print(f"comparing {', '.join(methods)} on {cfg.workload}, {seeds} seed(s)")
        console.print(f"  on {runner.where}")
        results = compare(base, methods, list(range(seeds)), runner, on_run=done, on_fail=failed)
    runs = results.runs
    bsp = next((m for m in methods if get_method(m).name == "bsp"), "bsp")  # "ddp" too
    summary = summarize(runs, target, reference=bsp, source=source, failed=results.failed)
    meta = {
        "workload": cfg.workload,
        "workers": runner.workers,
        "seeds": list(range(seeds)),
        "epochs": cfg.epochs,
        "where": runner.where,
        "eval_every": base.eval_every,
        "stop_at_target": stop_at_target,
        **provenance(),
    }
    write_csv(out / "steps.csv", runs)
    write_evals_csv(out / "evals.csv", runs)
    write_markdown(out / "summary.md", summary, meta)
    write_json(out / "summary.json", {**summary, "meta": meta})
    if json_path:
        write_json(json_path, {**summary, "meta": meta})
    metric = next((m["metric_name"] for m in summary["methods"].values() if m["metric_name"]), None)
    if metric is None:
        raise click.ClickException(f"every run failed; report written to {out}/summary.md")
    plot_metric(
        out / "metric_vs_time.png",
        out / "metric_vs_step.png",
        runs,
        metric,
        f"{cfg.workload}: {metric} of the averaged model",
        target,
    )
    console.print(summary_table(summary))
    for line in summary["verdicts"]:
        console.print(f"  {line}")
    console.print(f"report written to {out}/summary.md")
