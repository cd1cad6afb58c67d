"""Settings that cannot work are refused before any worker starts, with a message naming the fix."""

from __future__ import annotations

import os

from dssync.errors import UsageError
from dssync.lab.config import TrainConfig
from dssync.lab.methods import GROUP_SIZE, configure, get_method
from dssync.lab.train.checkpoint import any_checkpoints
from dssync.lab.train.device import resolve_device
from dssync.lab.train.resume import preflight, run_header


def validate(cfg: TrainConfig, workers: int) -> None:
    """Raise :class:`~dssync.errors.UsageError` for settings that cannot work with ``workers``."""
    world = int(os.environ.get("WORLD_SIZE", workers))
    size = cfg.group_size or GROUP_SIZE
    if cfg.sync == "dssync" and cfg.schedule != "global" and size > world:
        raise UsageError(
            f"--group-size {size} is larger than the {world} workers; "
            f"use a group size from 1 to {world}"
        )
    if (
        cfg.sync in ("dssync", "dssync-static", "dssync-overlap")
        and cfg.schedule in ("shuffle", "static")
        and world % size
    ):
        sizes = [k for k in range(1, world + 1) if world % k == 0]
        raise UsageError(
            f"--group-size {size} does not divide the {world} workers; "
            f"use one of {', '.join(map(str, sizes))}"
        )
    full = configure(cfg)  # with the preset's options where none was given
    replan = full.replan
    if cfg.sync == "auto" and cfg.replan is None:  # it may pick a re-planned preset
        replan = get_method("dssync-topo-local").options.get("replan", 0)
    if full.overlap and replan:
        raise UsageError(
            f"{cfg.sync} with overlap and replan={replan}: an overlapped average hides "
            "its transfer time, which is what re-planning measures; add --replan 0 "
            "(in a label, replan=0), or drop the overlap"
        )
    if cfg.data_dir is not None and not os.path.exists(cfg.data_dir):
        raise UsageError(
            f"--data-dir {cfg.data_dir} does not exist; pass the folder that holds the data"
        )
    if cfg.swa_lr is not None and cfg.swa_start is None:
        raise UsageError(
            "--swa-lr holds the rate during weight averaging; add --swa-start FRACTION"
        )
    resolve_device(cfg.device, local_rank=0)
    _validate_checkpointing(cfg, world)


def _validate_checkpointing(cfg: TrainConfig, world: int) -> None:
    if cfg.checkpoint_dir is None:
        if cfg.checkpoint_every or cfg.resume:
            flag = "--resume" if cfg.resume else "--checkpoint-every"
            raise UsageError(f"{flag} needs a folder; add --checkpoint-dir DIR")
        return
    if os.path.exists(cfg.checkpoint_dir) and not os.path.isdir(cfg.checkpoint_dir):
        raise UsageError(
            f"--checkpoint-dir {cfg.checkpoint_dir} is a file, not a folder; pass a folder (it is created if missing)"
        )
    if cfg.resume:
        preflight(cfg.checkpoint_dir, run_header(cfg, world))
    elif any_checkpoints(cfg.checkpoint_dir):
        raise UsageError(
            f"--checkpoint-dir {cfg.checkpoint_dir} already holds checkpoints of another run; "
            "add --resume to continue it, or pass an empty folder"
        )
