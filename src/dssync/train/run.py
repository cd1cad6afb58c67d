"""Run a training job: local workers by default, or this process as one rank under torchrun."""

from __future__ import annotations

from typing import Any

from dssync.launch import init_from_env, launched_externally, spawn
from dssync.train.config import TrainConfig
from dssync.train.loop import train_worker


def run_training(cfg: TrainConfig, workers: int = 4, timeout_s: float | None = None) -> dict[str, Any] | None:
    """Train with ``workers`` local processes, or as one rank when torchrun launched this process.

    Returns rank 0's summary (None on the other ranks under torchrun).
    """
    if launched_externally():
        import torch.distributed as dist

        init_from_env(timeout_s=cfg.timeout_s)
        try:
            summary = train_worker(cfg)
        finally:
            dist.destroy_process_group()
        return summary if int(_env("RANK")) == 0 else None
    budget = timeout_s or max(600.0, cfg.timeout_s * 4)
    return spawn(train_worker, workers, args=(cfg,), timeout_s=budget,
                 collective_timeout_s=cfg.timeout_s)[0]


def _env(name: str) -> str:
    import os

    return os.environ[name]
