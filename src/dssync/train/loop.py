"""The training loop every rank runs, whatever the synchronization method."""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from dssync.comm import average_tensors, consensus_distance
from dssync.train.config import TrainConfig
from dssync.train.factory import build_strategy
from dssync.train.swa import WeightAverage, recompute_batch_norm
from dssync.workloads import Workload, get, shard


def averaged_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` holding the mean of every rank's parameters and floating buffers.

    All ranks call this; their own modules are left untouched.
    """
    avg = copy.deepcopy(module)
    tensors = [p for p in avg.parameters()] + [b for b in avg.buffers() if b.is_floating_point()]
    with torch.no_grad():
        average_tensors(tensors, None, dist.get_world_size())
    return avg


def steps_per_epoch(n_train: int, world_size: int, batch_size: int) -> int:
    """Batches per epoch, the same on every rank (shards differ in size by at most one)."""
    steps = (n_train // world_size) // batch_size
    if steps < 1:
        raise ValueError(
            f"{n_train} training samples over {world_size} workers give no full batch of "
            f"{batch_size}; use a smaller --batch-size or fewer --workers"
        )
    return steps


def train_worker(cfg: TrainConfig) -> dict[str, Any]:
    """Train on this rank's shard; returns the run summary (complete on rank 0).

    The process group must already be initialized (by :func:`dssync.launch.spawn` or torchrun).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    wl = get(cfg.workload, data_dir=cfg.data_dir, **cfg.workload_options)
    batch = cfg.batch_size or wl.batch_size
    if cfg.lr is not None:
        wl.lr = cfg.lr
    train_set, test_set = wl.datasets()
    local = shard(train_set, rank, world, seed=cfg.seed)
    n_steps = steps_per_epoch(len(train_set), world, batch)

    torch.manual_seed(cfg.seed)
    module = wl.model()
    optimizer = wl.optimizer(module.parameters())
    strategy = build_strategy(cfg, module, optimizer)
    torch.manual_seed(cfg.seed * 1000 + rank)

    total = n_steps * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, n_steps * cfg.epochs)
    bar = _progress(cfg, rank, total)
    log: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    compute_s = sync_s = train_s = 0.0
    step = 0
    swa_from = None if cfg.swa_start is None else int(cfg.swa_start * total)
    swa = None
    for epoch in range(cfg.epochs):
        loader = DataLoader(local, batch_size=batch, shuffle=True, drop_last=True,
                            generator=torch.Generator().manual_seed(cfg.seed * 7919 + epoch * 31 + rank))
        for i, b in enumerate(loader):
            if i >= n_steps or step >= total:
                break
            t0 = time.perf_counter()
            loss = wl.loss(strategy.model, b)
            loss.backward()
            strategy.after_backward()
            optimizer.step()
            strategy.after_step()
            optimizer.zero_grad(set_to_none=True)
            if cfg.slow_rank == rank and cfg.slow_ms > 0:
                time.sleep(cfg.slow_ms / 1000)
            dt = time.perf_counter() - t0
            s = strategy.take_sync_time()
            sync_s += s
            compute_s += dt - s
            train_s += dt
            step += 1
            if swa_from is not None and step > swa_from:
                swa = swa or WeightAverage(strategy.module)
                swa.update(strategy.module)
            log.append({"step": step, "epoch": epoch, "time_s": train_s, "loss": loss.item(),
                        "iter_s": dt, "sync_s": s})
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            if cfg.eval_every and step % cfg.eval_every == 0:
                evals.append(_eval_record(wl, strategy.module, test_set, step, epoch, train_s))
        if not cfg.eval_every and step <= total:
            evals.append(_eval_record(wl, strategy.module, test_set, step, epoch, train_s))
        if step >= total:
            break
    if bar is not None:
        bar.close()

    own = wl.evaluate(strategy.module, test_set)
    distance = consensus_distance(strategy.module)
    strategy.average_all()
    final = wl.evaluate(strategy.module, test_set)
    swa_metric = None
    if swa is not None:
        swa_metric = _swa_ensemble(wl, swa, local, test_set, batch)[wl.metric_name]
    per_rank = [None] * world
    dist.all_gather_object(per_rank, {"metric": own[wl.metric_name], "compute_s": compute_s,
                                      "sync_s": sync_s, "steps": step})
    steps_done = max(step, 1)
    summary = {
        "config": cfg.to_dict(),
        "world_size": world,
        "workload": wl.name,
        "sync": cfg.sync,
        "metric_name": wl.metric_name,
        "higher_is_better": wl.higher_is_better,
        "final_metric": final[wl.metric_name],
        "final_loss": final["loss"],
        "final_accuracy": final.get("accuracy"),
        "swa_metric": swa_metric,
        "worker_metric": [r["metric"] for r in per_rank],
        "worker_accuracy": [r["metric"] for r in per_rank] if wl.metric_name == "accuracy" else None,
        "consensus_distance": distance,
        "steps": step,
        "iter_time_s": float(np.mean([(r["compute_s"] + r["sync_s"]) / steps_done for r in per_rank])),
        "compute_time_s": float(np.mean([r["compute_s"] / steps_done for r in per_rank])),
        "sync_time_s": float(np.mean([r["sync_s"] / steps_done for r in per_rank])),
        "train_time_s": train_s,
        "log": log,
        "evals": evals,
    }
    return summary


def _swa_ensemble(wl: Workload, swa: WeightAverage, local, test_set, batch: int) -> dict[str, float]:
    """Average every worker's running weight mean, re-estimate batch norm, evaluate (all ranks call)."""
    ensemble = averaged_copy(swa.module)
    loader = DataLoader(local, batch_size=batch, shuffle=False)
    recompute_batch_norm(ensemble, loader, lambda m, b: wl.loss(m, b))
    ensemble = averaged_copy(ensemble)  # every worker's batch-norm estimate, averaged
    return wl.evaluate(ensemble, test_set)


def _eval_record(wl: Workload, module: nn.Module, test_set, step: int, epoch: int, t: float) -> dict[str, Any]:
    """Metric of the globally averaged model (all ranks call this)."""
    metrics = wl.evaluate(averaged_copy(module), test_set)
    return {"step": step, "epoch": epoch, "time_s": t, **{k: float(v) for k, v in metrics.items()
                                                           if isinstance(v, int | float) and math.isfinite(v)}}


def _progress(cfg: TrainConfig, rank: int, total: int):
    if rank != 0 or not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{cfg.sync} {cfg.workload}", unit="step", leave=False, dynamic_ncols=True)
