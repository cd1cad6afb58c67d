"""`dssync train`: one training run, local workers by default or one rank under torchrun."""

from __future__ import annotations

import click

from dssync.cli.output import console, public_summary, training_table, write_json
from dssync.schedules import SCHEDULE_NAMES
from dssync.train import TrainConfig, run_training
from dssync.train.device import DEVICES
from dssync.train.factory import STRATEGIES
from dssync.train.lr import LR_SCHEDULES
from dssync.train.validate import validate
from dssync.workloads import WORKLOADS


def training_options(f):
    """Options shared by every command that trains (train, compare)."""
    opts = [
        click.option(
            "--workload",
            type=click.Choice(sorted(WORKLOADS)),
            default="mnist",
            show_default=True,
            help="Model and data.",
        ),
        click.option(
            "--workers",
            type=click.IntRange(1, 64),
            default=4,
            show_default=True,
            help="Local worker processes (ignored under torchrun).",
        ),
        click.option(
            "--group-size",
            type=click.IntRange(1),
            default=2,
            show_default=True,
            help="Ranks per DS-Sync group.",
        ),
        click.option(
            "--schedule",
            type=click.Choice(SCHEDULE_NAMES),
            default="shuffle",
            show_default=True,
            help="How DS-Sync groups change between steps.",
        ),
        click.option(
            "--repeat",
            type=click.IntRange(1),
            default=None,
            help="Cycle this many shuffled partitions (default: a fresh one every step).",
        ),
        click.option(
            "--replan-every",
            type=click.IntRange(1),
            default=8,
            show_default=True,
            help="Steps between re-plans of dssync-topo (also its plan's longest gap between crossings).",
        ),
        click.option("--epochs", type=click.IntRange(1), default=3, show_default=True),
        click.option(
            "--batch-size",
            type=click.IntRange(1),
            default=None,
            help="Per-worker batch (workload default).",
        ),
        click.option(
            "--lr",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Learning rate (workload default).",
        ),
        click.option(
            "--lr-schedule",
            type=click.Choice(LR_SCHEDULES),
            default=None,
            help="Learning-rate schedule over the run (workload default: cosine for wrn, else constant).",
        ),
        click.option(
            "--data-dir",
            type=click.Path(),
            default=None,
            help="Local data folder for the workload.",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            type=click.FloatRange(min=1),
            default=120.0,
            show_default=True,
            help="Seconds any collective may wait before the run fails.",
        ),
        click.option(
            "--max-steps", type=click.IntRange(1), default=None, help="Stop after this many steps."
        ),
        click.option(
            "--swa-start",
            type=click.FloatRange(0, 1, max_open=True),
            default=None,
            help="Keep a running weight average from this fraction of the run; report the SWA ensemble.",
        ),
        click.option(
            "--swa-lr",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Hold the learning rate at this value while the weights are averaged (default: keep "
            "following --lr-schedule).",
        ),
        click.option("--quiet", is_flag=True, help="No progress bar."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


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
    "--device",
    type=click.Choice(DEVICES),
    default="auto",
    show_default=True,
    help="Where to train: auto is CUDA when present (the GPU numbered LOCAL_RANK), else the CPU.",
)
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
    sync,
    seed,
    average_momentum,
    device,
    json_path,
    checkpoint_dir,
    checkpoint_every,
    resume,
) -> None:
    """Train WORKLOAD with one synchronization method and print a summary table.

    Spawns --workers processes on this machine (gloo on loopback; nccl when each has a GPU of its
    own). Under torchrun (`torchrun --nproc-per-node N -m dssync train ...`) this process is one
    rank instead. With --resume, a run may continue with another number of workers than wrote it.
    """
    cfg = TrainConfig(
        workload=workload,
        sync=sync,
        schedule=schedule,
        group_size=group_size,
        repeat=repeat,
        replan_every=replan_every,
        epochs=epochs,
        seed=seed,
        batch_size=batch_size,
        lr=lr,
        lr_schedule=lr_schedule,
        data_dir=data_dir,
        timeout_s=timeout_s,
        max_steps=max_steps,
        average_momentum=average_momentum,
        swa_start=swa_start,
        swa_lr=swa_lr,
        progress=not quiet,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every or 0,
        resume=resume,
        device=device,
    )
    validate(cfg, workers)
    summary = run_training(cfg, workers=workers)
    if summary is None:
        return  # a non-zero rank under torchrun
    console.print(training_table([summary]))
    if json_path:
        write_json(json_path, public_summary(summary))
        console.print(f"summary written to {json_path}")
