"""Settings of one training run, shared by the CLI, the local launcher and torchrun workers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainConfig:
    """Everything a worker needs to train; the same on every rank.

    Example::

        cfg = TrainConfig(workload="digits", sync="dssync", group_size=2, epochs=2)
    """

    workload: str = "mnist"
    sync: str = "dssync"
    schedule: str = "shuffle"
    group_size: int = 2
    period: int | None = None
    epochs: int = 3
    seed: int = 0
    batch_size: int | None = None
    lr: float | None = None
    lr_schedule: str | None = None
    data_dir: str | None = None
    workload_options: dict[str, Any] = field(default_factory=dict)
    local_sgd_period: int = 4
    average_momentum: bool = False
    bucket_mb: float = 25.0
    timeout_s: float = 120.0
    max_steps: int | None = None
    eval_every: int = 0
    slow_rank: int | None = None
    slow_ms: float = 0.0
    swa_start: float | None = None
    swa_lr: float | None = None
    progress: bool = True
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    device: str = "auto"
    crash_rank: int | None = None
    crash_at_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate(cfg: TrainConfig, workers: int) -> None:
    """Reject settings that cannot work, before any worker starts; the message names the fix."""
    import os

    world = int(os.environ.get("WORLD_SIZE", workers))
    if cfg.sync == "dssync" and cfg.schedule != "global" and cfg.group_size > world:
        raise ValueError(
            f"--group-size {cfg.group_size} is larger than the {world} workers; "
            f"use a group size from 1 to {world}"
        )
    if cfg.slow_rank is not None and cfg.slow_rank >= world:
        raise ValueError(f"--slow-rank {cfg.slow_rank} does not exist with {world} workers; use 0 to {world - 1}")
    if cfg.data_dir is not None and not os.path.exists(cfg.data_dir):
        raise FileNotFoundError(f"--data-dir {cfg.data_dir} does not exist; pass the folder that holds the data")
    if cfg.crash_rank is not None and cfg.crash_rank >= world:
        raise ValueError(f"--crash-rank {cfg.crash_rank} does not exist with {world} workers; use 0 to {world - 1}")
    if cfg.swa_lr is not None and cfg.swa_start is None:
        raise ValueError("--swa-lr holds the rate during weight averaging; add --swa-start FRACTION")
    _validate_checkpointing(cfg, world)


def _validate_checkpointing(cfg: TrainConfig, world: int) -> None:
    import os

    if cfg.checkpoint_dir is None:
        if cfg.checkpoint_every or cfg.resume:
            flag = "--resume" if cfg.resume else "--checkpoint-every"
            raise ValueError(f"{flag} needs a folder; add --checkpoint-dir DIR")
        return
    if os.path.exists(cfg.checkpoint_dir) and not os.path.isdir(cfg.checkpoint_dir):
        raise NotADirectoryError(
            f"--checkpoint-dir {cfg.checkpoint_dir} is a file, not a folder; pass a folder (it is created if missing)"
        )
    from dssync.train.checkpoint import any_checkpoints

    if cfg.resume:
        from dssync.train.resume import preflight, run_header

        preflight(cfg.checkpoint_dir, run_header(cfg, world))
    elif any_checkpoints(cfg.checkpoint_dir):
        raise FileExistsError(
            f"--checkpoint-dir {cfg.checkpoint_dir} already holds checkpoints of another run; "
            "add --resume to continue it, or pass an empty folder"
        )
