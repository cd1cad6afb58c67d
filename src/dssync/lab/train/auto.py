"""``--sync auto`` in a training run: measure, probe, let the planner pick, say why.

Every rank times a few forward and backward passes of a copy of its model on one of its own
batches (the first is a warm-up; each rank's fastest pass, the slowest rank's figure counts), the ranks detect their
topology with a short link probe, and :func:`dssync.lab.plan.auto.choose` picks the method. Every
rank computes the same choice from the same shared figures, so no further agreement is needed.

A resumed run keeps the pick its checkpoints record (:func:`saved_pick`: rank 0's newest
checkpoint, shared with every rank) rather than choosing again: a new probe on a busy network
may pick another method or ``every``, and the run would then continue as a different method
from the one its checkpoint was written by. ``--every``, ``--outer``, ``--group-size`` or
``--wire`` that would change the kept pick are refused. The topology is detected again, and probed where the
kept method plans from rates; a re-planned plan then continues from the rates its checkpoint
saved (:meth:`dssync.DSSync.load_state_dict`).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from dssync.comm.clock import clock
from dssync.comm.meta import bounded, from_first, slowest
from dssync.comm.side import side_group
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError
from dssync.lab.config import TrainConfig
from dssync.lab.methods import DEFAULT_WINDOW, RATES, get_method, preset_value, with_pick
from dssync.lab.train.checkpoint import (
    CheckpointDamaged,
    CheckpointError,
    name_parts,
    rank_checkpoints,
    read_header,
)
from dssync.lab.train.data import RankData
from dssync.lab.train.device import to_device
from dssync.topology import Topology, detect

AUTO = "auto"
PICKED = ("every", "outer", "group_size", "wire")  # what a pick sets beyond the method (with_pick)
TIMED_PASSES = 5


@dataclass(frozen=True)
class Decision:
    """What ``--sync auto`` chose (a method name), why (one line), and what it saw; a resumed
    run's pick says which checkpoint step it was kept from."""

    method: str
    reason: str
    compute_s: float
    topology: Topology
    every: int | None = None
    outer: str | None = None
    group_size: int | None = None
    wire: str | None = None
    kept_from: int | None = None  # a resumed run's pick: the checkpoint step it was read from
    predicted_s: float | None = None  # the pick's predicted iteration (seconds)

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "reason": self.reason,
            "compute_s": self.compute_s,
            "every": self.every,
            "outer": self.outer,
            "group_size": self.group_size,
            "wire": self.wire,
            "kept_from": self.kept_from,
            "predicted_s": self.predicted_s,
        }

    def line(self) -> str:
        """The one line rank 0 prints."""
        kept = (
            f"the pick its checkpoints record (read at step {self.kept_from}), "
            if self.kept_from is not None
            else ""
        )
        return f"--sync auto: {kept}{self.reason}"


def compute_time(
    data: RankData, module: nn.Module, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S
) -> float:
    """Seconds of one forward and backward pass: each rank's fastest of :data:`TIMED_PASSES`
    (after a warm-up), the slowest rank's figure (collective).

    The fastest pass is the one least disturbed by whatever else the machine runs at start-up;
    the median of three read 4.7 to 31 ms on the same emulated hosts (S2 and S3, 2026-12-05).
    On the emulated cluster (``DSSYNC_CLUSTER`` set) every host shares one machine's cores, so
    the ranks time their passes one after another: all at once, eight hosts on two cores read
    four to five times their compute (90 ms against 18 ms a step in training on S2), which is the
    emulator's sharing, not what a host of its own would see.
    """
    trial = copy.deepcopy(module)
    batch = to_device(next(iter(DataLoader(data.local, batch_size=data.batch_size))), device)
    side = side_group()
    what = "timing the compute"

    def timed() -> list[float]:
        times = []
        for _ in range(TIMED_PASSES + 1):
            t0 = clock(device)
            data.wl.loss(trial, batch).backward()
            times.append(clock(device) - t0)
        return times[1:]  # the first is a warm-up

    if not os.environ.get("DSSYNC_CLUSTER"):
        return slowest(min(timed()), side, timeout_s, what)
    bounded(dist.barrier, group=side, timeout_s=timeout_s, what=what)  # nobody still loading
    for turn in range(dist.get_world_size()):
        if turn == dist.get_rank():
            mine = min(timed())
        bounded(dist.barrier, group=side, timeout_s=timeout_s, what=what)
    return slowest(mine, side, timeout_s, what)


def saved_pick(cfg: TrainConfig) -> dict[str, Any] | None:
    """The pick recorded in rank 0's newest intact checkpoint when ``cfg`` resumes an auto run,
    the same on every rank (collective); None when there is none to keep."""
    if not (cfg.resume and cfg.checkpoint_dir):
        return None  # every rank sees the same cfg: nobody gathers
    pick: dict[str, Any] | None = None
    if dist.get_rank() == 0:
        try:
            pick = _newest_pick(cfg.checkpoint_dir)
        except CheckpointError as e:  # every rank raises it, none waits for rank 0
            pick = {"error": str(e)}
    pick = from_first(pick, side_group(), cfg.timeout_s, "reading auto's pick")
    if pick is not None and "error" in pick:
        raise CheckpointError(pick["error"])
    return pick


def _effective(decision: Decision, option: str) -> Any:
    """What the kept pick ran for ``option``: its own value, else its method's (pairs for the
    group size), so ``--every 4`` against a pick that kept its preset's 4 is no change."""
    value = getattr(decision, option)
    return preset_value(decision.method, option) if value is None else value


def _used(decision: Decision, option: str) -> str:
    value = getattr(decision, option)
    return f"its method's own, {_effective(decision, option)}" if value is None else str(value)


def _newest_pick(folder: str) -> dict[str, Any] | None:
    for _, path in sorted(rank_checkpoints(folder, 0).items(), reverse=True):
        try:
            pick = read_header(path).get(AUTO)
        except CheckpointDamaged:
            continue  # the resume names it; an older file still says what was picked
        return None if pick is None else {**pick, "step": name_parts(path)[1]}
    return None


def decide(cfg: TrainConfig, data: RankData, module: nn.Module, device: torch.device) -> Decision:
    """The method ``--sync auto`` runs for ``cfg`` here (all ranks call this alike)."""
    from dssync.lab.plan.auto import choose

    dtype = next(module.parameters()).dtype
    kept = saved_pick(cfg)
    if kept is not None:  # its links are probed again only when the kept method plans from rates
        rates = RATES in get_method(kept["method"]).needs
        topo = detect(probe=rates, timeout_s=cfg.timeout_s, device=device, dtype=dtype)
        return Decision(
            kept["method"],
            kept["reason"],
            kept["compute_s"],
            topo,
            kept.get("every"),
            kept.get("outer"),
            # a checkpoint written before auto picked the group size: the size given now stands
            kept.get("group_size", cfg.group_size),
            kept.get("wire", cfg.wire),  # likewise for a checkpoint from before it picked the wire
            kept_from=kept["step"],
            predicted_s=kept.get("predicted_s"),
        )
    compute_s = compute_time(data, module, device, cfg.timeout_s)
    topo = detect(probe=True, timeout_s=cfg.timeout_s, device=device, dtype=dtype)
    floats = [b for b in module.buffers() if b.is_floating_point()]
    params = sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in floats)
    local = cfg.every is None or cfg.every > 1  # --every 1: an average every step
    repeat = cfg.replan or DEFAULT_WINDOW
    choice = choose(
        topo,
        params,
        compute_s,
        repeat=repeat,
        local=local,
        every=cfg.every,
        outer=cfg.outer,
        group_size=cfg.group_size,
        wire=cfg.wire,
    )
    return Decision(
        choice.method,
        choice.reason,
        compute_s,
        topo,
        choice.every,
        choice.outer,
        choice.group_size,
        choice.wire,
        predicted_s=choice.predicted_s,
    )


def resolve(
    cfg: TrainConfig, data: RankData, module: nn.Module, device: torch.device
) -> tuple[TrainConfig, Decision | None]:
    """``cfg`` with ``sync`` set to the chosen method when it says ``auto`` (else as it is); the
    options given (``--every`` etc.) reach the chosen method if it takes them, and a local-step
    pick's ``every``, ``outer``, ``group_size`` and ``wire`` fill the options not given. The decision
    records the ones the run uses (None: the method's own)."""
    if cfg.sync != AUTO:
        return cfg, None
    decision = decide(cfg, data, module, device)
    if decision.kept_from is not None:
        clash = [
            f"--{k.replace('_', '-')} {getattr(cfg, k)} "
            f"(the checkpoints' run used {_used(decision, k)})"
            for k in PICKED
            if getattr(cfg, k) is not None and getattr(cfg, k) != _effective(decision, k)
        ]
        if clash:
            raise UsageError(
                f"--sync auto resumes with the pick its checkpoints record ({decision.method}), "
                f"which this run's {', '.join(clash)} would change; resume without them, or with "
                f"--sync {decision.method} and the options you want"
            )
    chosen = with_pick(cfg, decision.method, *(getattr(decision, k) for k in PICKED))
    return chosen, replace(decision, **{k: getattr(chosen, k) for k in PICKED})
