"""Run a training job: local workers by default, or this process as one rank under torchrun."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dssync.errors import UsageError
from dssync.lab.config import TrainConfig
from dssync.lab.launch import init_from_env, launched_externally, spawn
from dssync.lab.train.device import backend_for, resolve_device
from dssync.lab.train.hooks import StepHook
from dssync.lab.train.loop import train_worker
from dssync.lab.train.summary import write_json


def run_training(
    cfg: TrainConfig, workers: int = 4, timeout_s: float | None = None, hook: StepHook | None = None
) -> dict[str, Any] | None:
    """Train with ``workers`` local processes, or as one rank when torchrun launched this process.

    Returns rank 0's summary (None on the other ranks under torchrun). ``hook`` (tests and
    benchmarks only) is called at fixed points of every step on every rank.
    """
    if launched_externally():
        summaries: list[dict[str, Any] | None] = []
        train_series([cfg], lambda _, summary: summaries.append(summary), hook)
        return summaries[0]
    budget = timeout_s or max(600.0, cfg.timeout_s * 4)
    return spawn(
        train_worker,
        workers,
        args=(cfg, hook),
        timeout_s=budget,
        collective_timeout_s=cfg.timeout_s,
        backend=backend_for(resolve_device(cfg.device, 0), workers),
    )[0]


def train_series(
    cfgs: list[TrainConfig],
    done: Callable[[int, dict[str, Any] | None], None],
    hook: StepHook | None = None,
) -> None:
    """Under torchrun: join the process group once, train every config in turn, leave.

    ``done(i, summary)`` follows run ``i``: rank 0's summary, None on the other ranks. One
    launch for many runs saves each later run the start of a process on every host (torchrun's
    agent and rendezvous, importing torch, torch's lazy imports on the first optimizer): about
    18 s per run on the 8 hosts of the emulated S2 cluster sharing two cores. Each run builds its
    model, data, strategy and random streams from its own config, warms up before its clock
    (:func:`dssync.lab.train.loop.warm_up`), and ends with every rank holding one model, so it is
    the run a fresh process would make.
    """
    _same_group(cfgs)
    _join_group(cfgs[0])
    try:
        for i, cfg in enumerate(cfgs):
            summary = train_worker(cfg, hook)
            done(i, summary if int(_env("RANK")) == 0 else None)
    finally:
        dist.destroy_process_group()


def spawn_series(
    cfgs: list[TrainConfig],
    workers: int,
    summaries: list[str],
    tick: Callable[[], object] | None = None,
) -> None:
    """:func:`train_series` on ``workers`` local processes: rank 0 writes run ``i``'s summary to
    ``summaries[i]`` as it ends; ``tick()`` is called while they run (:func:`dssync.lab.launch.spawn`)."""
    _same_group(cfgs)
    cfg = cfgs[0]
    spawn(
        _series_rank,
        workers,
        args=(cfgs, summaries),
        timeout_s=max(600.0, cfg.timeout_s * 4) * len(cfgs),
        collective_timeout_s=cfg.timeout_s,
        backend=backend_for(resolve_device(cfg.device, 0), workers),
        tick=tick,
    )


def _series_rank(cfgs: list[TrainConfig], summaries: list[str]) -> None:
    for cfg, path in zip(cfgs, summaries, strict=True):
        summary = train_worker(cfg)
        if dist.get_rank() == 0:
            write_json(path, summary)


def _same_group(cfgs: list[TrainConfig]) -> None:
    """Refuse runs that could not share one process group (made for the first's settings)."""
    for cfg in cfgs[1:]:
        for key in ("device", "timeout_s"):  # set once, when the process group is joined
            if getattr(cfg, key) != getattr(cfgs[0], key):
                raise UsageError(
                    f"runs in one launch share the process group, made for the first run's "
                    f"{key}={getattr(cfgs[0], key)!r}; a later run has {getattr(cfg, key)!r}: "
                    "launch it apart"
                )


def _env(name: str) -> str:
    return os.environ[name]


def _join_group(cfg: TrainConfig) -> None:
    """Join torchrun's process group; after an elastic restart, in a store namespace of its own.

    torchrun keeps one store for all restarts of a job, so without the namespace a restarted
    worker may read a dead peer's address left by the previous attempt and fail to connect.
    The namespace counts this rank's starts in the store, not ``TORCHELASTIC_RESTART_COUNT``:
    each agent counts only its own hosts' failures, so after one host's worker dies the hosts
    disagree on it, while every round of torchrun's rendezvous starts every rank once.
    """
    device = resolve_device(cfg.device)
    backend = backend_for(device, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ or "MASTER_ADDR" not in os.environ:
        init_from_env(backend=backend, timeout_s=cfg.timeout_s)
        return
    rank, world = int(_env("RANK")), int(_env("WORLD_SIZE"))
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        _env("MASTER_ADDR"),
        int(_env("MASTER_PORT")),
        world,
        is_master=not agent_store and rank == 0,
        timeout=timedelta(seconds=cfg.timeout_s),
    )
    starts = store.add(f"dssync/starts/rank{rank}", 1)
    store = dist.PrefixStore(f"dssync/start{starts}", store)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=cfg.timeout_s)
    )
