"""The training loop every rank runs, whatever the synchronization method.

:func:`train_worker` reads as the run goes: place the rank on its device, load its data, build
the model and the strategy, restore a checkpoint, then for each step take a batch, set the rate,
train, keep the SWA average, log, evaluate, checkpoint; finally summarize. Each of those is a
small named piece in this package (``data``, ``lr``, ``swa``, ``state``, ``summary``, ``device``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm.meta import bounded
from dssync.comm.side import side_group
from dssync.errors import PeerLost, SyncError
from dssync.lab.baselines.protocol import after_backward, replicas_equal, take_sync_time, time_sync
from dssync.lab.config import TrainConfig
from dssync.lab.methods import RATES, get_method
from dssync.lab.train.auto import AUTO, Decision, resolve
from dssync.lab.train.data import RankData
from dssync.lab.train.device import Clock, resolve_device, to_device
from dssync.lab.train.factory import build_strategy
from dssync.lab.train.hooks import StepHook
from dssync.lab.train.lr import LRSchedule
from dssync.lab.train.progress import Progress
from dssync.lab.train.resume import run_header
from dssync.lab.train.state import Checkpointer, RunState
from dssync.lab.train.summary import eval_record, summarize
from dssync.lab.train.swa import WeightAverage
from dssync.lab.workloads import Workload
from dssync.strategies import DSSync, Strategy
from dssync.topology import Topology, detect

# torch.distributed's own types for a collective that failed because a peer died or never came.
LOST_PEER_ERRORS = (dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError)


def train_worker(cfg: TrainConfig, hook: StepHook | None = None) -> dict[str, Any]:
    """Train on this rank's shard; returns the run summary (the same on every rank).

    The process group must already be initialized (by :func:`dssync.lab.launch.spawn` or torchrun).
    With ``cfg.checkpoint_dir`` the run writes a checkpoint every ``cfg.checkpoint_every`` steps
    (default: every epoch) and, with ``cfg.resume``, continues from the newest complete one, also
    when it was written by another number of workers. ``hook`` is for tests and benchmarks.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    hook = hook or StepHook()
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    data = RankData.load(cfg, rank, world)
    strategy, optimizer, decision = build(cfg, data, device, rank)
    total = data.total_steps()
    phase = SWAPhase.of(cfg, total)
    # Built before a resume loads the optimizer, whose saved groups hold a scheduled, not the base, rate.
    rates = rate_schedule(cfg, data, optimizer, total, phase)
    saver = checkpointer(cfg, data, strategy, optimizer, rank, world, decision)
    run, phase.average = restore(cfg, saver)
    start = plan_of(strategy)  # after a resume: the plan the checkpoint's run had come to
    warm_up(data.wl, strategy.module, lambda: to_device(data.sample(), device), device)
    hook.started(rank, strategy)
    clock = Clock(device)
    progress = Progress.of(cfg, rank, total, run.step, data.steps_per_epoch)
    loop_start = clock.now()
    while run.step < total:
        batch = to_device(data.batch(run.step), device)
        rates.apply(run.step)
        loss = timed_step(data, strategy, optimizer, batch, run, clock, hook, rank)
        phase.update(run.step, strategy.module)
        run.log[-1].update(
            loss=loss, lr=optimizer.param_groups[0]["lr"], epoch=data.epoch(run.step - 1)
        )
        progress.update(run.step, loss)
        if evaluation_due(cfg, run.step, data.steps_per_epoch, total):
            epoch = data.epoch(run.step - 1)
            run.evals.append(
                eval_record(
                    data.wl,
                    strategy.module,
                    data.test,
                    run.step,
                    epoch,
                    run.train_s,
                    equal=replicas_equal(strategy),
                    timeout_s=cfg.timeout_s,
                )
            )
        if saver is not None and checkpoint_due(cfg, run.step, data.steps_per_epoch, total):
            saver.save(run, phase.average)
        hook.after_step(rank, run.step)
        if cfg.stop_at is not None and run.evals and run.evals[-1]["step"] == run.step:
            if reached(data.wl, run.evals[-1], cfg.stop_at, cfg.timeout_s):
                break
    progress.close()
    run.loop_s += clock.now() - loop_start
    summary = summarize(cfg, data, strategy, run, phase.average, device)
    summary["plan"] = {**start, "switches": [list(s) for s in getattr(strategy, "switches", [])]}
    strategy.close()  # its threads and groups: the process may train again (train_series)
    return summary if decision is None else {**summary, "auto": decision.to_dict()}


def build(
    cfg: TrainConfig, data: RankData, device: torch.device, rank: int
) -> tuple[Strategy, torch.optim.Optimizer, Decision | None]:
    """The model (seeded alike on every rank) on ``device``, its optimizer and the strategy;
    with ``--sync auto``, also what was chosen and why (rank 0 prints the one line)."""
    torch.manual_seed(cfg.seed)
    module = data.wl.model().to(device)
    optimizer = data.wl.optimizer(module.parameters())
    cfg, decision = resolve(cfg, data, module, device, optimizer)
    if decision is not None and rank == 0:
        print(decision.line(), file=sys.stderr, flush=True)
    topology = decision.topology if decision is not None else start_topology(cfg, module, device)
    strategy = build_strategy(cfg, module, optimizer, topology)
    time_sync(strategy)  # the lab reads take_sync_time() every step
    torch.manual_seed(cfg.seed * 1000 + rank)
    return strategy, optimizer, decision


def start_topology(cfg: TrainConfig, module: nn.Module, device: torch.device) -> Topology | None:
    """The topology a preset that plans from link rates starts from: detected and probed here,
    before the training clock, as ``--sync auto`` does before it picks (else a race's preset and
    auto's pick of that preset plan from different topologies); None for every other method."""
    if RATES not in get_method(cfg.sync).needs:
        return None
    dtype = next(module.parameters()).dtype
    return detect(probe=True, timeout_s=cfg.timeout_s, device=device, dtype=dtype)


def plan_of(strategy: Strategy) -> dict[str, str | None]:
    """Where a run's groups come from at its start, for its summary: the topology planned from
    (with the probed rates) and the schedule; None where the strategy has neither."""
    schedule = getattr(strategy, "schedule", None)
    source = strategy._plan_source() if isinstance(strategy, DSSync) else None
    topology = None if source is None else source[0]  # a topology-aware plan's
    return {
        "topology": None if topology is None else topology.describe(),
        "schedule": None if schedule is None else schedule.describe(),
    }


class SWAPhase:
    """Stochastic weight averaging's phase: from step ``start`` on, each step's model joins a
    running average (none when ``start`` is None).

    Example::

        phase = SWAPhase(start=75)
        phase.update(step, model)      # after each step; phase.average is the running mean
    """

    def __init__(self, start: int | None, average: WeightAverage | None = None) -> None:
        self.start = start
        self.average = average

    @classmethod
    def of(cls, cfg: TrainConfig, total: int) -> SWAPhase:
        return cls(None if cfg.swa_start is None else int(cfg.swa_start * total))

    def update(self, step: int, module: nn.Module) -> None:
        if self.start is not None and step > self.start:
            self.average = self.average or WeightAverage(module)
            self.average.update(module)


def warm_up(
    wl: Workload,
    module: nn.Module,
    sample: Callable[[], Any],
    device: torch.device,
    passes: int = 2,
) -> None:
    """Forward and backward ``passes`` times before the clock starts, and leave no trace.

    A process's first passes pay once for what later ones reuse (memory, autograd's set-up): on
    rank 0 of an emulated S2 host a DS-Sync run's first step computed for 162.8 ms and its second
    for 70.7 ms, against a median of 24.8 ms after.
    ``--sync auto`` runs such passes anyway to time the compute, so without this every other
    method started its clock cold beside it. ``sample()`` gives the batch. The module's buffers
    (batch norm's statistics), its gradients and the random streams are as they were: the run is
    the same with or without.
    """
    buffers = [b.detach().clone() for b in module.buffers()]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        batch = sample()  # a data loader draws its seed from the random stream: inside the fork
        for _ in range(passes):
            wl.loss(module, batch).backward()
    module.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, saved in zip(module.buffers(), buffers, strict=True):
            b.copy_(saved)


def rate_schedule(
    cfg: TrainConfig, data: RankData, optimizer: torch.optim.Optimizer, total: int, phase: SWAPhase
) -> LRSchedule:
    """The learning rate by step: the workload's (or --lr-schedule's), held at --swa-lr while
    weights are averaged."""
    held = cfg.swa_lr is not None and phase.start is not None
    return LRSchedule(
        optimizer,
        cfg.lr_schedule or data.wl.lr_schedule,
        total,
        hold_from=phase.start if held else None,
        hold_lr=cfg.swa_lr if held else None,
    )


def checkpointer(
    cfg: TrainConfig,
    data: RankData,
    strategy: Strategy,
    optimizer: torch.optim.Optimizer,
    rank: int,
    world: int,
    decision: Decision | None = None,
) -> Checkpointer | None:
    """The run's checkpoint writer and reader; an auto run's files also record its pick, which a
    resume keeps (:func:`dssync.lab.train.auto.saved_pick`)."""
    if cfg.checkpoint_dir is None:
        return None
    header = {
        **run_header(cfg, world, strategy.module),
        "batch_size": data.batch_size,
        "train_samples": len(data.train),
        "steps_per_epoch": data.steps_per_epoch,
    }
    if decision is not None:
        header[AUTO] = decision.to_dict()
    return Checkpointer(cfg.checkpoint_dir, rank, world, header, strategy, optimizer)


def restore(cfg: TrainConfig, saver: Checkpointer | None) -> tuple[RunState, WeightAverage | None]:
    """The progress and SWA average to continue from: a checkpoint's with --resume, else fresh."""
    if saver is not None and cfg.resume:
        found = saver.resume()
        if found is not None:
            return found.run, found.swa
    return RunState(), None


def timed_step(
    data: RankData,
    strategy: Strategy,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    run: RunState,
    clock: Clock,
    hook: StepHook,
    rank: int,
) -> float:
    """One training step, timed on the device's clock; adds its times to ``run`` and its log."""
    t0 = clock.now()
    try:
        loss = data.wl.loss(strategy.model, batch)
        loss.backward()
        hook.before_sync(rank, run.step + 1)
        after_backward(strategy)
        optimizer.step()
        strategy.step()
        optimizer.zero_grad(set_to_none=True)
    except LOST_PEER_ERRORS as e:
        raise lost_peer(e, strategy, rank, run.step + 1) from e
    value = loss.item()
    dt = clock.now() - t0
    sync = take_sync_time(strategy)
    run.step += 1
    run.sync_s += sync
    run.compute_s += dt - sync
    run.train_s += dt
    run.log.append({"step": run.step, "time_s": run.train_s, "iter_s": dt, "sync_s": sync})
    return value


def lost_peer(e: Exception, strategy: Strategy, rank: int, step: int) -> SyncError:
    """A :class:`PeerLost` naming the step, this rank's group and the peers it was waiting for."""
    if isinstance(e, SyncError):
        return e
    world = dist.get_world_size()
    group = strategy.current_group() if hasattr(strategy, "current_group") else list(range(world))
    peers = [r for r in group if r != rank] or [r for r in range(world) if r != rank]
    who = f"rank {peers[0]}" if len(peers) == 1 else f"one of ranks {peers}"
    return PeerLost(
        f"rank {rank} lost contact with {who} at step {step} (group {group}; {type(e).__name__}): "
        "it died or stopped answering; rerun with --resume to continue from the last checkpoint",
        step=step,
        group=group,
        ranks=peers,
    )


def reached(wl: Workload, record: dict[str, Any], target: float, timeout_s: float) -> bool:
    """Whether an evaluation's metric is at or past ``target``. Every rank evaluated the same
    averaged model, but the decision is rank 0's, broadcast, so no rank stops alone."""
    value = record.get(wl.metric_name)
    mine = value is not None and (value >= target if wl.higher_is_better else value <= target)
    flag = torch.tensor([float(mine)])
    what = "the stop at the target (rank 0's evaluation)"
    bounded(dist.broadcast, flag, src=0, group=side_group(), timeout_s=timeout_s, what=what)
    return bool(flag.item())


def evaluation_due(cfg: TrainConfig, step: int, steps_per_epoch: int, total: int) -> bool:
    """Every ``cfg.eval_every`` steps, or at the end of each epoch and of the run."""
    if cfg.eval_every:
        return step % cfg.eval_every == 0
    return step % steps_per_epoch == 0 or step == total


def checkpoint_due(cfg: TrainConfig, step: int, steps_per_epoch: int, total: int) -> bool:
    """Every ``cfg.checkpoint_every`` steps (default: each epoch) and at the end of the run."""
    return step % (cfg.checkpoint_every or steps_per_epoch) == 0 or step == total
