"""What a run reports: evaluations of the averaged model, the SWA ensemble and the final summary.

Every function here is collective (all ranks call it). Models are evaluated on the CPU: the
evaluation sets are small and the workloads' metrics are written for CPU tensors.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from dssync.comm import average_tensors, consensus_distance, meta
from dssync.comm.clock import clock
from dssync.comm.meta import gather_objects
from dssync.comm.side import side_group
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.lab.config import TrainConfig
from dssync.lab.methods import configure
from dssync.lab.train.data import RankData
from dssync.lab.train.state import RunState
from dssync.lab.train.swa import WeightAverage, recompute_batch_norm
from dssync.lab.workloads import Workload
from dssync.strategies import Strategy

# What a bounded wait for the evaluation's timings says it was waiting for.
EVAL_TIMING = "the evaluation's timing (slowest rank)"


def averaged_copy(
    module: nn.Module, parameters: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S
) -> nn.Module:
    """A copy of ``module`` holding the mean of every rank's parameters and floating buffers.

    All ranks call this; their own modules are left untouched. ``parameters=False`` averages the
    floating buffers alone, for a strategy whose ranks hold equal parameters already
    (:func:`dssync.lab.baselines.protocol.replicas_equal`). A rank missing past ``timeout_s``
    raises :class:`~dssync.errors.PeerLost`.
    """
    return timed_average(module, parameters, timeout_s)[0]


def timed_average(
    module: nn.Module, parameters: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[nn.Module, float]:
    """:func:`averaged_copy`, and the seconds its transfer took on this rank: from when every
    rank had come (waiting for a late one is not counted) until the mean was in (0 when there
    was nothing to average)."""
    avg = copy.deepcopy(module)
    tensors = [p for p in avg.parameters()] if parameters else []
    tensors += [b for b in avg.buffers() if b.is_floating_point()]
    if not tensors:
        return avg, 0.0
    with torch.no_grad():
        came = average_tensors(tensors, None, dist.get_world_size(), timeout_s=timeout_s)
    return avg, clock(tensors[0].device) - came


def model_digest(module: nn.Module) -> str:
    """sha256 of every parameter and buffer, in order: equal digests mean bit-for-bit equal models."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def evaluate(wl: Workload, module: nn.Module, data) -> dict[str, float]:
    """``wl``'s metrics of ``module`` on ``data``, computed on a CPU copy when it lives elsewhere."""
    if next(module.parameters()).device.type != "cpu":
        module = copy.deepcopy(module).cpu()
    return wl.evaluate(module, data)


def slowest(seconds: float, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """The largest of every rank's ``seconds`` (collective; metadata through the side group);
    PeerLost, not the backend's error, when a rank is missing past ``timeout_s``."""
    return meta.slowest(seconds, side_group(), timeout_s, EVAL_TIMING)


def eval_record(
    wl: Workload,
    module: nn.Module,
    test_set,
    step: int,
    epoch: int,
    t: float,
    equal: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Metrics of the globally averaged model at ``step`` (``equal``: the ranks' parameters are
    equal already, so only the buffers are averaged).

    ``time_s`` is the training time (evaluations excluded) of the slowest rank so far, the time
    a job waits for; ``rank_time_s`` is this rank's own ``t``. Every rank evaluates the same
    average (rank 0 alone would leave the others waiting in a collective bounded by
    ``timeout_s`` for as long as a large model's evaluation takes). A rank missing past
    ``timeout_s`` raises PeerLost.

    The evaluated model exists on no rank until that global average is taken, so
    ``averaged_time_s`` adds its cost to ``time_s``: the longest any rank spent in its transfer,
    counted from when every rank had come (so another rank's evaluation or checkpoint, which
    the training clock leaves out, is not charged). A user who stopped there would pay it once
    (``average_all()``); where the replicas are equal it costs only the buffers' average.
    """
    average, transfer = timed_average(module, not equal, timeout_s)
    metrics = evaluate(wl, average, test_set)
    slowest_t, longest = meta.largest([t, transfer], side_group(), timeout_s, EVAL_TIMING)
    return {
        "step": step,
        "epoch": epoch,
        "time_s": slowest_t,
        "averaged_time_s": slowest_t + longest,
        "rank_time_s": t,
        **{
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and math.isfinite(v)
        },
    }


def swa_ensemble(
    wl: Workload,
    swa: WeightAverage,
    data: RankData,
    device: torch.device,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, float]:
    """Average every worker's running weight mean, re-estimate batch norm, evaluate."""
    ensemble = averaged_copy(swa.module, timeout_s=timeout_s)
    loader = DataLoader(data.local, batch_size=data.batch_size, shuffle=False)
    recompute_batch_norm(ensemble, loader, device)
    ensemble = averaged_copy(ensemble, timeout_s=timeout_s)  # every worker's batch-norm estimate
    return evaluate(wl, ensemble, data.test)


def header(cfg: TrainConfig, wl: Workload, final: dict[str, float]) -> dict[str, Any]:
    """The fields every run summary starts with: the config (its method's preset filled in), the
    workload and method, and ``final``'s metrics (an :func:`evaluate` after the final average)."""
    return {
        "config": configure(cfg).to_dict(),
        "workload": wl.name,
        "sync": cfg.sync,
        "metric_name": wl.metric_name,
        "higher_is_better": wl.higher_is_better,
        "final_metric": final[wl.metric_name],
        "final_loss": final["loss"],
        "final_accuracy": final.get("accuracy"),
    }


def summarize(
    cfg: TrainConfig,
    data: RankData,
    strategy: Strategy,
    run: RunState,
    swa: WeightAverage | None,
    device: torch.device,
) -> dict[str, Any]:
    """The run's summary (the same on every rank): metrics, spread, consensus, time split."""
    wl, world = data.wl, dist.get_world_size()
    own = evaluate(wl, strategy.module, data.test)
    digest = model_digest(strategy.module)
    distance = consensus_distance(strategy.module, timeout_s=cfg.timeout_s)
    strategy.average_all()
    final_digest = model_digest(strategy.module)  # equal on every rank, buffers and all
    final = evaluate(wl, strategy.module, data.test)
    swa_metric = (
        None if swa is None else swa_ensemble(wl, swa, data, device, cfg.timeout_s)[wl.metric_name]
    )
    steps_done = max(run.step, 1)
    per_rank = gather_objects(  # metadata: through the gloo side group, never nccl
        {
            "metric": own[wl.metric_name],
            "compute_s": run.compute_s,
            "sync_s": run.sync_s,
            "train_s": run.train_s,
            "loop_s": run.loop_s,
            "digest": digest,
            "final_digest": final_digest,
            "threads": torch.get_num_threads(),
        },
        side_group(),
        cfg.timeout_s,
        what="the run's summary",
    )
    iters = [(r["compute_s"] + r["sync_s"]) / steps_done for r in per_rank]
    return {
        **header(cfg, wl, final),
        "world_size": world,
        "device": str(device),
        "swa_metric": swa_metric,
        "worker_metric": [r["metric"] for r in per_rank],
        "worker_accuracy": [r["metric"] for r in per_rank]
        if wl.metric_name == "accuracy"
        else None,
        "consensus_distance": distance,
        "worker_model_sha256": [r["digest"] for r in per_rank],
        "final_model_sha256": [r["final_digest"] for r in per_rank],
        "steps": run.step,
        "resumed_from": run.resumed_from,
        "iter_time_s": float(np.mean(iters)),
        "rank_iter_time_s": iters,
        "rank_sync_time_s": [r["sync_s"] / steps_done for r in per_rank],
        "rank_train_time_s": [r["train_s"] for r in per_rank],
        "rank_loop_time_s": [r["loop_s"] for r in per_rank],
        "rank_threads": [r["threads"] for r in per_rank],
        "compute_time_s": float(np.mean([r["compute_s"] / steps_done for r in per_rank])),
        "sync_time_s": float(np.mean([r["sync_s"] / steps_done for r in per_rank])),
        "train_time_s": max(r["train_s"] for r in per_rank),  # the slowest rank's
        "rank0_train_time_s": run.train_s,
        "log": run.log,
        "evals": run.evals,
    }


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` atomically: a partial file never replaces a good one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=_plain)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
