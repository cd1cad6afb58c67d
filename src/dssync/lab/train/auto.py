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

:func:`auto` is the same rule in a training script: it times the script's own forward and
backward pass, probes, picks and returns the configured :class:`~dssync.DSSync` with the
:class:`Decision` (whose :meth:`Decision.line` is the line the CLI prints). Both paths time with
:func:`time_passes`, pick with :func:`pick` and apply the pick with :func:`apply`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from dssync.comm.clock import clock, module_device
from dssync.comm.meta import bounded, from_first, slowest
from dssync.comm.side import side_group
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError
from dssync.lab.config import TrainConfig
from dssync.lab.methods import (
    RATES,
    configure,
    get_method,
    preset_value,
    with_pick,
)
from dssync.lab.train.checkpoint import (
    CheckpointDamaged,
    CheckpointError,
    name_parts,
    rank_checkpoints,
    read_header,
)
from dssync.lab.train.data import RankData
from dssync.lab.train.device import to_device
from dssync.schedules.topology import DEFAULT_MAX_EVERY
from dssync.strategies import DSSync
from dssync.strategies.before_step import is_adaptive
from dssync.topology import Topology, detect

AUTO = "auto"
AUTO_FLAG = "--sync auto"  # who chose, in the line the CLI prints (Decision.line)
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
    by: str = AUTO_FLAG  # who chose: the CLI's flag, or auto() in a script

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
        """The one line rank 0 prints: who chose, what and why."""
        kept = (
            f"the pick its checkpoints record (read at step {self.kept_from}), "
            if self.kept_from is not None
            else ""
        )
        return f"{self.by}: {kept}{self.reason}"


def compute_time(
    data: RankData, module: nn.Module, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S
) -> float:
    """Seconds of one forward and backward pass of a copy of ``module`` on one of this rank's
    batches (:func:`time_passes`; collective)."""
    trial = copy.deepcopy(module)
    batch = to_device(next(iter(DataLoader(data.local, batch_size=data.batch_size))), device)
    return time_passes(lambda: data.wl.loss(trial, batch).backward(), device, None, timeout_s)


def time_passes(
    one_pass: Callable[[], object],
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """Seconds of ``one_pass()`` (a forward and backward pass): each rank's fastest of
    :data:`TIMED_PASSES` (after a warm-up), the slowest rank's figure (collective over
    ``group``).

    The fastest pass is the one least disturbed by whatever else the machine runs at start-up;
    the median of three read 4.7 to 31 ms on the same emulated hosts (S2 and S3, 2026-12-05).
    On the emulated cluster (``DSSYNC_CLUSTER`` set) every host shares one machine's cores, so
    the ranks time their passes one after another: all at once, eight hosts on two cores read
    four to five times their compute (90 ms against 18 ms a step in training on S2), which is the
    emulator's sharing, not what a host of its own would see.
    """
    side = side_group(group)
    what = "timing the compute"

    def timed() -> list[float]:
        times = []
        for _ in range(TIMED_PASSES + 1):
            t0 = clock(device)
            one_pass()
            times.append(clock(device) - t0)
        return times[1:]  # the first is a warm-up

    if not os.environ.get("DSSYNC_CLUSTER"):
        return slowest(min(timed()), side, timeout_s, what)
    bounded(dist.barrier, group=side, timeout_s=timeout_s, what=what)  # nobody still loading
    for turn in range(dist.get_world_size(group)):
        if turn == dist.get_rank(group):
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


def decide(
    cfg: TrainConfig,
    data: RankData,
    module: nn.Module,
    device: torch.device,
    optimizer: torch.optim.Optimizer | None = None,
) -> Decision:
    """The method ``--sync auto`` runs for ``cfg`` here (all ranks call this alike)."""
    dtype = next(module.parameters()).dtype
    kept = saved_pick(cfg)
    if kept is not None:  # its links are probed again only when the kept method plans from rates
        rates = RATES in get_method(kept["method"]).needs
        topo = detect(probe=rates, timeout_s=cfg.timeout_s, device=device, dtype=dtype)
        return replay(kept, topo, cfg)
    compute_s = compute_time(data, module, device, cfg.timeout_s)
    topo = detect(probe=True, timeout_s=cfg.timeout_s, device=device, dtype=dtype)
    return pick(cfg, topo, module, compute_s, adaptive=is_adaptive(optimizer))


def replay(
    kept: dict[str, Any], topology: Topology, cfg: TrainConfig, by: str = AUTO_FLAG
) -> Decision:
    """The decision a saved pick records (:meth:`Decision.to_dict`, with the checkpoint's
    ``step`` where a checkpoint recorded it), on the ``topology`` detected now."""
    return Decision(
        kept["method"],
        kept["reason"],
        kept["compute_s"],
        topology,
        kept.get("every"),
        kept.get("outer"),
        # a checkpoint written before auto picked the group size: the size given now stands
        kept.get("group_size", cfg.group_size),
        kept.get("wire", cfg.wire),  # likewise for a checkpoint from before it picked the wire
        kept_from=kept.get("step"),
        predicted_s=kept.get("predicted_s"),
        by=by,
    )


def pick(
    cfg: TrainConfig,
    topology: Topology,
    module: nn.Module,
    compute_s: float,
    by: str = AUTO_FLAG,
    adaptive: bool = False,
) -> Decision:
    """What the planner (:func:`dssync.lab.plan.auto.choose`) picks for ``module`` on
    ``topology`` at ``compute_s`` a pass, with the options ``cfg`` gives (``every``, ``outer``,
    ``group_size``, ``wire``, ``replan``; None: the planner's); ``adaptive``: an Adam-family
    optimizer steps the module."""
    from dssync.lab.plan.auto import choose

    floats = [b for b in module.buffers() if b.is_floating_point()]
    params = sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in floats)
    local = cfg.every is None or cfg.every > 1  # --every 1: an average every step
    repeat = cfg.replan or DEFAULT_MAX_EVERY
    choice = choose(
        topology,
        params,
        compute_s,
        repeat=repeat,
        local=local,
        every=cfg.every,
        outer=cfg.outer,
        group_size=cfg.group_size,
        wire=cfg.wire,
        spell=None if by == AUTO_FLAG else (lambda option: f"{option}="),
        adaptive=adaptive,
    )
    return Decision(
        choice.method,
        choice.reason,
        compute_s,
        topology,
        choice.every,
        choice.outer,
        choice.group_size,
        choice.wire,
        predicted_s=choice.predicted_s,
        by=by,
    )


def apply(cfg: TrainConfig, decision: Decision) -> tuple[TrainConfig, Decision]:
    """``cfg`` for the picked method: the options given reach it if it takes them, and the
    pick's ``every``, ``outer``, ``group_size`` and ``wire`` fill the ones not given; the
    decision then records the ones the run uses (None: the method's own)."""
    chosen = with_pick(cfg, decision.method, *(getattr(decision, k) for k in PICKED))
    return chosen, replace(decision, **{k: getattr(chosen, k) for k in PICKED})


def resolve(
    cfg: TrainConfig,
    data: RankData,
    module: nn.Module,
    device: torch.device,
    optimizer: torch.optim.Optimizer | None = None,
) -> tuple[TrainConfig, Decision | None]:
    """``cfg`` with ``sync`` set to the chosen method when it says ``auto`` (else as it is); the
    options given (``--every`` etc.) reach the chosen method if it takes them, and a local-step
    pick's ``every``, ``outer``, ``group_size`` and ``wire`` fill the options not given. The decision
    records the ones the run uses (None: the method's own)."""
    if cfg.sync != AUTO:
        return cfg, None
    decision = decide(cfg, data, module, device, optimizer)
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
    return apply(cfg, decision)


class Picked(NamedTuple):
    """What :func:`auto` returns: the configured DSSync and the decision that configured it."""

    sync: DSSync
    decision: Decision


def auto(
    module: nn.Module,
    measure: Callable[[], object],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    process_group: dist.ProcessGroup | None = None,
    probe: bool = True,
    every: int | None = None,
    outer: str | None = None,
    group_size: int | None = None,
    wire: str | None = None,
    seed: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    keep: dict[str, Any] | None = None,
) -> Picked:
    """``--sync auto`` in a script: time ``measure``, probe the links, let the planner pick, and
    return the :class:`~dssync.DSSync` it picked, configured, with the :class:`Decision`
    (``decision.line()`` says what was chosen and why, as the CLI's line does).

    Every rank of ``process_group`` (default: all) calls this alike, after
    ``init_process_group`` and with ``module`` on its device. ``measure()`` runs one forward
    pass (and backward) of ``module`` on a representative batch; when it returns a tensor that
    needs a gradient, ``auto`` calls ``backward()`` on it. It runs 1 + :data:`TIMED_PASSES`
    times; each rank's fastest pass, the slowest rank's figure, is the compute. Afterwards
    the module has no gradients, and its buffers (batch-norm statistics) and the random
    streams are as they were. ``probe=False`` skips the link probe (the planner then takes
    1 Gbit/s hosts). ``every``, ``outer`` (``"none"``, ``"nesterov"`` or ``"auto"``: nesterov, none after Adam), ``group_size`` and
    ``wire`` fix what the planner would otherwise pick (``every=1``: an average every step);
    ``optimizer`` has its state averaged too, as ``DSSync(optimizer=...)``.

    auto picks among DS-Sync's presets, DDP and hierarchical all-reduce; when DDP or
    hierarchical all-reduce is predicted fastest it raises ``UsageError`` with the reason, since
    neither is a DSSync (wrap the model in ``DistributedDataParallel`` then). A pick is not
    stored: a resumed script that calls ``auto`` again may pick anew (the CLI keeps the pick its
    checkpoints record). To keep it, save ``decision.to_dict()`` with the checkpoint and pass it
    back as ``keep=``: nothing is timed then, and the links are probed again only where the kept
    method plans from their rates.

    Example (every rank, under ``torchrun``)::

        sync, decision = auto(model, lambda: loss_fn(model(x), y), optimizer=opt)
        if dist.get_rank() == 0:
            print(decision.line())  # auto(): dssync-topo-local: predicted 21 ms per iteration ...
        for x, y in loader:
            loss_fn(model(x), y).backward()
            opt.step(); opt.zero_grad()
            sync.step()
    """
    fixed = {"every": every, "outer": outer, "group_size": group_size, "wire": wire}
    given = [k for k, v in fixed.items() if v is not None]
    if keep is not None and given:
        raise UsageError(
            f"keep= replays a saved pick with its own {', '.join(given)}; drop "
            f"{', '.join(k + '=' for k in given)} or call auto without keep= to pick anew"
        )
    if not dist.is_initialized():
        raise UsageError(
            "auto(...) is collective: call torch.distributed.init_process_group first "
            "(torchrun sets the ranks), then auto on every rank"
        )
    world = dist.get_world_size(process_group)
    if world < 2:
        raise UsageError(
            f"auto(...) plans how ranks average, and the group has {world} rank; launch 2 or "
            "more (torchrun --nproc-per-node 2 ...)"
        )
    if not callable(measure):
        raise UsageError(
            f"measure={measure!r} is not callable; pass a function of no arguments that runs "
            "one forward (and backward) pass, e.g. lambda: loss_fn(model(x), y)"
        )
    device = module_device(module)
    dtype = next((p.dtype for p in module.parameters()), torch.float32)
    cfg = TrainConfig(
        sync=AUTO,
        every=every,
        outer=outer,
        group_size=group_size,
        wire=wire,
        seed=seed,
        timeout_s=timeout_s,
        average_momentum=optimizer is not None,
    )
    if keep is not None:
        rates = probe and RATES in get_method(keep["method"]).needs
        topo = detect(process_group, probe=rates, timeout_s=timeout_s, device=device, dtype=dtype)
        decision = replay(keep, topo, cfg, by="auto(keep=...)")
    else:
        compute_s = _measured(module, measure, device, process_group, timeout_s)
        topo = detect(process_group, probe=probe, timeout_s=timeout_s, device=device, dtype=dtype)
        decision = pick(cfg, topo, module, compute_s, by="auto()", adaptive=is_adaptive(optimizer))
    cfg, decision = apply(cfg, decision)
    method = get_method(cfg.sync)
    if not method.preset:
        raise UsageError(
            f"auto() picked {method.name}, which is not a DSSync: {decision.reason}. Wrap the "
            "model in torch.nn.parallel.DistributedDataParallel here (an all-reduce every step "
            "is predicted fastest), or build the DSSync you want yourself"
        )
    sync = method.build(configure(cfg), module, optimizer, topo, process_group=process_group)
    return Picked(sync, decision)


def _measured(
    module: nn.Module,
    measure: Callable[[], object],
    device: torch.device,
    group: dist.ProcessGroup | None,
    timeout_s: float,
) -> float:
    """:func:`time_passes` of ``measure``, leaving ``module``'s gradients cleared and its buffers
    and the random streams as they were."""
    buffers = [b.detach().clone() for b in module.buffers()]

    def one_pass() -> None:
        out = measure()
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.backward()

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        seconds = time_passes(one_pass, device, group, timeout_s)
    module.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, saved in zip(module.buffers(), buffers, strict=True):
            b.copy_(saved)
    return seconds
