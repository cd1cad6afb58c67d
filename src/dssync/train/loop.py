"""The training loop every rank runs, whatever the synchronization method."""

from __future__ import annotations

import copy
import hashlib
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from dssync.comm import average_tensors, consensus_distance
from dssync.train.config import TrainConfig
from dssync.train.factory import build_strategy
from dssync.train.lr import LRSchedule
from dssync.train.resume import run_header
from dssync.train.state import Checkpointer, RunState
from dssync.train.swa import WeightAverage, recompute_batch_norm
from dssync.workloads import Workload, get, shard

CRASH_EXIT_CODE = 3


def averaged_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` holding the mean of every rank's parameters and floating buffers.

    All ranks call this; their own modules are left untouched.
    """
    avg = copy.deepcopy(module)
    tensors = [p for p in avg.parameters()] + [b for b in avg.buffers() if b.is_floating_point()]
    with torch.no_grad():
        average_tensors(tensors, None, dist.get_world_size())
    return avg


def load_data(wl: Workload, cfg: TrainConfig):
    """The workload's (train, test) sets; a --data-dir in the wrong format is the user's error, named."""
    try:
        return wl.datasets()
    except (ValueError, OSError):
        raise  # the workloads' own messages already name the file and the fix
    except Exception as e:  # noqa: BLE001 - unreadable files surface as any unpickling/parsing error
        if cfg.data_dir is None:
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ValueError(
            f"cannot read the {cfg.workload} data in --data-dir {cfg.data_dir} ({type(e).__name__}: {first}); "
            f"pass a folder in the format `dssync train --workload {cfg.workload}` expects (see --help)"
        ) from e


def model_digest(module: nn.Module) -> str:
    """sha256 of every parameter and buffer, in order: equal digests mean bit-for-bit equal models."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def steps_per_epoch(n_train: int, world_size: int, batch_size: int) -> int:
    """Batches per epoch, the same on every rank (shards differ in size by at most one)."""
    steps = (n_train // world_size) // batch_size
    if steps < 1:
        raise ValueError(
            f"{n_train} training samples over {world_size} workers give no full batch of "
            f"{batch_size}; use a smaller --batch-size or fewer --workers"
        )
    return steps


class WorkerLostError(RuntimeError):
    """A collective failed because a peer worker died or stopped answering; names the suspects."""


def train_worker(cfg: TrainConfig) -> dict[str, Any]:
    """Train on this rank's shard; returns the run summary (complete on rank 0).

    The process group must already be initialized (by :func:`dssync.launch.spawn` or torchrun).
    With ``cfg.checkpoint_dir`` the run writes a checkpoint every ``cfg.checkpoint_every`` steps
    (default: every epoch) and, with ``cfg.resume``, continues from the newest one every rank holds.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    wl = get(cfg.workload, data_dir=cfg.data_dir, **cfg.workload_options)
    batch = cfg.batch_size or wl.batch_size
    if cfg.lr is not None:
        wl.lr = cfg.lr
    train_set, test_set = load_data(wl, cfg)
    local = shard(train_set, rank, world, seed=cfg.seed)
    n_steps = steps_per_epoch(len(train_set), world, batch)

    torch.manual_seed(cfg.seed)
    module = wl.model()
    optimizer = wl.optimizer(module.parameters())
    strategy = build_strategy(cfg, module, optimizer)
    torch.manual_seed(cfg.seed * 1000 + rank)

    total = n_steps * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, n_steps * cfg.epochs)
    run = RunState()
    swa_from = None if cfg.swa_start is None else int(cfg.swa_start * total)
    # Built before a resume loads the optimizer, whose saved groups hold a scheduled, not the base, rate.
    schedule = LRSchedule(optimizer, cfg.lr_schedule or wl.lr_schedule, total,
                          hold_from=swa_from if cfg.swa_lr is not None else None, hold_lr=cfg.swa_lr)
    saver = None
    if cfg.checkpoint_dir is not None:
        header = {**run_header(cfg, world, strategy.module), "steps_per_epoch": n_steps}
        saver = Checkpointer(cfg.checkpoint_dir, rank, header, strategy, optimizer)
        if cfg.resume:
            run = saver.resume() or run
    every = cfg.checkpoint_every or n_steps
    bar = _progress(cfg, rank, total, run.step)
    batches = None
    while run.step < total:
        epoch, i = divmod(run.step, n_steps)
        if batches is None or i == 0:
            batches = iter(DataLoader(local, batch_sampler=epoch_batches(len(local), batch, n_steps, i,
                                                                         cfg.seed * 7919 + epoch * 31 + rank)))
        b = next(batches)
        schedule.apply(run.step)
        t0 = time.perf_counter()
        try:
            loss = _train_step(wl, strategy, optimizer, b)
        except RuntimeError as e:
            raise _lost_peer(e, strategy, rank, world, run.step + 1) from e
        if cfg.slow_rank == rank and cfg.slow_ms > 0:
            time.sleep(cfg.slow_ms / 1000)
        dt = time.perf_counter() - t0
        s = strategy.take_sync_time()
        run.sync_s += s
        run.compute_s += dt - s
        run.train_s += dt
        run.step += 1
        step = run.step
        if swa_from is not None and step > swa_from:
            run.swa = run.swa or WeightAverage(strategy.module)
            run.swa.update(strategy.module)
        run.log.append({"step": step, "epoch": epoch, "time_s": run.train_s, "loss": loss.item(),
                        "iter_s": dt, "sync_s": s, "lr": optimizer.param_groups[0]["lr"]})
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if cfg.eval_every and step % cfg.eval_every == 0 or not cfg.eval_every and (i + 1 == n_steps or step == total):
            run.evals.append(_eval_record(wl, strategy.module, test_set, step, epoch, run.train_s))
        if saver is not None and (step % every == 0 or step == total):
            saver.save(run)
        _maybe_crash(cfg, rank, step)
    if bar is not None:
        bar.close()
    return _summary(cfg, wl, strategy, run, local, test_set, batch, world)


def epoch_batches(n: int, batch: int, n_steps: int, start: int, seed: int) -> list[list[int]]:
    """Batches ``start`` .. ``n_steps - 1`` of one epoch: a seeded permutation of ``n`` samples, cut.

    The order is a pure function of ``seed``, so a resumed run draws the batches it would have.
    """
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[j * batch:(j + 1) * batch] for j in range(start, n_steps)]


def _train_step(wl: Workload, strategy, optimizer: torch.optim.Optimizer, b) -> torch.Tensor:
    loss = wl.loss(strategy.model, b)
    loss.backward()
    strategy.after_backward()
    optimizer.step()
    strategy.after_step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def _lost_peer(e: RuntimeError, strategy, rank: int, world: int, step: int) -> BaseException:
    """Name the peers this rank was waiting for when a collective failed (died or hung)."""
    text = str(e)
    if not isinstance(e, dist.DistError) and not any(
            w in text for w in ("Connection", "closed", "timed out", "Timed out", "timeout", "gloo")):
        return e
    # DS-Sync advances its step only after its group's average succeeded: this is the failing group.
    group = strategy.current_group() if hasattr(strategy, "current_group") else list(range(world))
    peers = [r for r in group if r != rank] or [r for r in range(world) if r != rank]
    if "closed" in text or "Connection" in text:
        cause = "connection closed by peer"
    elif "imed out" in text or "timeout" in text:
        cause = "no answer within --timeout"
    else:
        cause = (text.strip().splitlines() or [type(e).__name__])[0][:120]
    who = f"rank {peers[0]}" if len(peers) == 1 else f"one of ranks {peers}"
    return WorkerLostError(
        f"rank {rank} lost contact with rank(s) {peers} at step {step} ({cause}): {who} died or "
        "stopped answering; rerun with --resume to continue from the last checkpoint"
    )


def _maybe_crash(cfg: TrainConfig, rank: int, step: int) -> None:
    """Test hook: rank ``cfg.crash_rank`` exits abruptly after ``cfg.crash_at_step`` steps, once.

    "Once" means: not after a torchrun restart, and not when the checkpoint folder holds the
    marker this writes before exiting.
    """
    if cfg.crash_rank != rank or cfg.crash_at_step != step:
        return
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    if cfg.checkpoint_dir is not None:
        marker = Path(cfg.checkpoint_dir) / f".crashed-rank{rank}"
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"crashed after step {step}\n")
    os._exit(CRASH_EXIT_CODE)


def _summary(cfg: TrainConfig, wl: Workload, strategy, run: RunState, local, test_set, batch: int,
             world: int) -> dict[str, Any]:
    own = wl.evaluate(strategy.module, test_set)
    digest = model_digest(strategy.module)
    distance = consensus_distance(strategy.module)
    strategy.average_all()
    final = wl.evaluate(strategy.module, test_set)
    swa_metric = None
    if run.swa is not None:
        swa_metric = _swa_ensemble(wl, run.swa, local, test_set, batch)[wl.metric_name]
    per_rank = [None] * world
    steps_done = max(run.step, 1)
    dist.all_gather_object(per_rank, {"metric": own[wl.metric_name], "compute_s": run.compute_s,
                                      "sync_s": run.sync_s, "steps": run.step,
                                      "digest": digest})
    iters = [(r["compute_s"] + r["sync_s"]) / steps_done for r in per_rank]
    return {
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
        "worker_model_sha256": [r["digest"] for r in per_rank],
        "steps": run.step,
        "resumed_from": run.resumed_from,
        "iter_time_s": float(np.mean(iters)),
        "rank_iter_time_s": iters,
        "rank_sync_time_s": [r["sync_s"] / steps_done for r in per_rank],
        "compute_time_s": float(np.mean([r["compute_s"] / steps_done for r in per_rank])),
        "sync_time_s": float(np.mean([r["sync_s"] / steps_done for r in per_rank])),
        "train_time_s": run.train_s,
        "log": run.log,
        "evals": run.evals,
    }


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


def _progress(cfg: TrainConfig, rank: int, total: int, done: int = 0):
    if rank != 0 or not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"{cfg.sync} {cfg.workload}", unit="step", leave=False,
                dynamic_ncols=True, disable=None)  # None: no bar when stderr is not a terminal
