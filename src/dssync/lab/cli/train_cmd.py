"""`dssync train`: one training run, local workers by default or one rank under torchrun."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import click

from dssync.lab.cli.options import training_options
from dssync.lab.cli.output import console, public_summary, training_table, write_json
from dssync.lab.methods import configure, is_elastic, method_names
from dssync.lab.train import TrainConfig, run_training
from dssync.lab.train.factory import STRATEGIES
from dssync.lab.train.validate import validate

if TYPE_CHECKING:
    from dssync.lab.elastic.launch import Chaos


@click.command()
@training_options
@click.option(
    "--sync",
    type=click.Choice(sorted(STRATEGIES)),
    default="dssync",
    show_default=True,
    help="Synchronization method.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--average-momentum", is_flag=True, help="DS-Sync also averages optimizer state.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the summary here as JSON.",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write per-worker checkpoints into this folder (created if missing).",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(1),
    default=None,
    help="Steps between checkpoints (default with --checkpoint-dir: every epoch).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue from the newest checkpoint in --checkpoint-dir; start fresh if there is none.",
)
@click.option(
    "--elastic",
    is_flag=True,
    help="Replicas that come and go, on torchft: start a Lighthouse and --workers replica "
    "processes, restart a lost one after --restart-delay (--sync dssync is elastic-dssync; "
    "torchft-diloco and torchft-local-sgd are torchft's own). Needs pip install 'dssync[elastic]'.",
)
@click.option(
    "--min-replicas",
    type=click.IntRange(1),
    default=None,
    help="--elastic: torchft's min_replicas: no averaging counts with fewer live replicas, and "
    "the run succeeds when at least this many finish (default: a majority of --workers; with "
    "fewer, the Lighthouse may form two quorums apart).",
)
@click.option(
    "--restart-delay",
    "restart_delay_s",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="--elastic: seconds before a lost replica is started again, as an orchestrator would.",
)
@click.option(
    "--lighthouse",
    default=None,
    metavar="URL",
    help="--elastic: join this torchft Lighthouse (http://HOST:PORT) instead of starting one.",
)
@click.option(
    "--heartbeat-ms",
    type=click.IntRange(100),
    default=None,
    help="--elastic: the Lighthouse's heartbeat timeout: a replica silent this long is left out "
    "of the next quorum, which waits that long after a loss (default 2000; torchft's 5000). "
    "Not with --lighthouse: a Lighthouse elsewhere has its own.",
)
@click.option(
    "--chaos-every",
    "chaos_every_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="--elastic: kill a random live replica every SECONDS, give or take 20% (torchft's "
    "punisher; the lost one is restarted after --restart-delay). For chaos tests and goodput.",
)
@click.option(
    "--chaos-seed",
    type=int,
    default=0,
    show_default=True,
    help="--elastic --chaos-every: the seed that draws the kills' times and victims.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="--elastic: keep the replicas' logs, step records and summaries here (default: a "
    "temporary folder, removed).",
)
def train(
    cfg: TrainConfig,
    workers: int,
    json_path: str | None,
    elastic: bool,
    min_replicas: int | None,
    restart_delay_s: float,
    lighthouse: str | None,
    heartbeat_ms: int | None,
    chaos_every_s: float | None,
    chaos_seed: int,
    log_dir: str | None,
) -> None:
    """Train WORKLOAD with one synchronization method and print a summary table.

    Spawns --workers processes on this machine (gloo on loopback; nccl when each has a GPU of its
    own). Under torchrun (`torchrun --nproc-per-node N -m dssync train ...`) this process is one
    rank instead. With --resume, a run may continue with another number of workers than wrote it.
    """
    if elastic or is_elastic(cfg.sync):
        chaos = None
        if chaos_every_s is not None:
            from dssync.lab.elastic.launch import Chaos

            chaos = Chaos(every_s=chaos_every_s, seed=chaos_seed)
        if heartbeat_ms is not None and lighthouse is not None:
            raise click.UsageError(
                "--heartbeat-ms sets the Lighthouse this run starts; with --lighthouse URL, set "
                "heartbeat_timeout_ms where that Lighthouse is started"
            )
        return train_elastic(
            cfg, workers, min_replicas, restart_delay_s, lighthouse, log_dir, json_path, chaos,
            heartbeat_ms,
        )  # fmt: skip
    given = [
        f
        for f, v in (
            ("--min-replicas", min_replicas),
            ("--lighthouse", lighthouse),
            ("--heartbeat-ms", heartbeat_ms),
            ("--chaos-every", chaos_every_s),
            ("--log-dir", log_dir),
        )
        if v is not None
    ]
    if given:
        raise click.UsageError(f"{', '.join(given)} only apply to an elastic run: add --elastic")
    validate(cfg, workers)
    summary = run_training(cfg, workers=workers)
    if summary is None:
        return  # a non-zero rank under torchrun
    console.print(training_table([summary]))
    if json_path:
        write_json(json_path, public_summary(summary))
        console.print(f"summary written to {json_path}")


def train_elastic(
    cfg: TrainConfig,
    workers: int,
    min_replicas: int | None,
    restart_delay_s: float,
    lighthouse: str | None,
    log_dir: str | None,
    json_path: str | None,
    chaos: Chaos | None = None,
    heartbeat_ms: int | None = None,
) -> None:
    """``--elastic``: the run on torchft's launcher, one line per event, then its summary."""
    from dssync.lab.elastic.launch import HEARTBEAT_MS, run_elastic

    if cfg.sync == "dssync":
        cfg = replace(cfg, sync="elastic-dssync")
    if not is_elastic(cfg.sync):
        elastic = ", ".join(n for n in method_names() if is_elastic(n))
        raise click.UsageError(
            f"--sync {cfg.sync} does not run elastically; use dssync or one of {elastic}"
        )
    if min_replicas is not None and min_replicas > workers:
        raise click.UsageError(
            f"--min-replicas {min_replicas} is more than the {workers} --workers; pass at most "
            f"{workers}"
        )
    if min_replicas is None:
        min_replicas = workers // 2 + 1  # a majority: two quorums can never form apart
    cfg = configure(cfg)
    validate(cfg, workers)
    summary = run_elastic(
        cfg,
        workers,
        min_replicas=min_replicas,
        restart_delay_s=restart_delay_s,
        lighthouse=lighthouse,
        timeout_s=None,
        folder=log_dir,
        say=lambda line: console.print(f"  {line}"),
        chaos=chaos,
        heartbeat_ms=heartbeat_ms or HEARTBEAT_MS,
    )
    e = summary["elastic"]
    restarts = sum(e["restarts"].values())
    same = len(set(e["final_model_sha256"].values())) == 1
    console.print(
        f"elastic {cfg.sync} on {cfg.workload}: {len(e['finished'])} of {e['replicas']} replicas "
        f"finished (min_replicas {e['min_replicas']}), {restarts} restart(s), "
        f"{summary['steps']} steps; {summary['metric_name']} {summary['final_metric']:.4f} "
        f"after the final average; one model on every finished replica: {'yes' if same else 'no'}"
    )
    if chaos is not None:
        console.print(
            f"chaos: {len(e['chaos_kills'])} replica(s) killed, every ~{chaos.every_s:g} s"
        )
    if json_path:
        write_json(json_path, summary)
        console.print(f"summary written to {json_path}")
