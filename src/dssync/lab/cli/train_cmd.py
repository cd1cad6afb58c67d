"""`dssync train`: one training run, local workers by default or one rank under torchrun."""

from __future__ import annotations

import click

from dssync.lab.cli.options import training_options
from dssync.lab.cli.output import console, public_summary, training_table, write_json
from dssync.lab.train import TrainConfig, run_training
from dssync.lab.train.factory import STRATEGIES
from dssync.lab.train.validate import validate


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
def train(
    cfg: TrainConfig,
    workers: int,
    json_path: str | None,
) -> None:
    """Train WORKLOAD with one synchronization method and print a summary table.

    Spawns --workers processes on this machine (gloo on loopback; nccl when each has a GPU of its
    own). Under torchrun (`torchrun --nproc-per-node N -m dssync train ...`) this process is one
    rank instead. With --resume, a run may continue with another number of workers than wrote it.
    """
    validate(cfg, workers)
    summary = run_training(cfg, workers=workers)
    if summary is None:
        return  # a non-zero rank under torchrun
    console.print(training_table([summary]))
    if json_path:
        write_json(json_path, public_summary(summary))
        console.print(f"summary written to {json_path}")
