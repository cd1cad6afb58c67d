"""Run a training job: local workers by default, or this process as one rank under torchrun."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from dssync.launch import default_backend, init_from_env, launched_externally, spawn
from dssync.train.config import TrainConfig
from dssync.train.loop import train_worker


def run_training(cfg: TrainConfig, workers: int = 4, timeout_s: float | None = None) -> dict[str, Any] | None:
    """Train with ``workers`` local processes, or as one rank when torchrun launched this process.

    Returns rank 0's summary (None on the other ranks under torchrun).
    """
    if launched_externally():
        import torch.distributed as dist

        _join_group(cfg.timeout_s)
        try:
            summary = train_worker(cfg)
        finally:
            dist.destroy_process_group()
        return summary if int(_env("RANK")) == 0 else None
    budget = timeout_s or max(600.0, cfg.timeout_s * 4)
    return spawn(train_worker, workers, args=(cfg,), timeout_s=budget,
                 collective_timeout_s=cfg.timeout_s)[0]


def _env(name: str) -> str:
    return os.environ[name]


def _join_group(timeout_s: float) -> None:
    """Join torchrun's process group; after an elastic restart, in a store namespace of its own.

    torchrun keeps one store for all restarts of a job, so without the namespace a restarted
    worker may read a dead peer's address left by the previous attempt and fail to connect.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or "MASTER_ADDR" not in os.environ:
        init_from_env(timeout_s=timeout_s)
        return
    import torch.distributed as dist

    rank, world = int(_env("RANK")), int(_env("WORLD_SIZE"))
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(_env("MASTER_ADDR"), int(_env("MASTER_PORT")), world,
                          is_master=not agent_store and rank == 0, timeout=timedelta(seconds=timeout_s))
    store = dist.PrefixStore(f"dssync/attempt{attempt}", store)
    backend = default_backend()
    if backend == "nccl":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
