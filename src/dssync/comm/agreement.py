"""Start-up agreement: before any averaging, every rank checks it shapes the collectives alike.

One all-gather of a few 63-bit fingerprints (:func:`dssync.comm.consensus.fingerprint_check`,
over the side group) compares what decides the number, size, dtype and order of the buffers each
step moves: the sync method (blocking and overlapped DS-Sync make different groups and tags),
how pairs average (``pairs=``: groups made per pair or none), the model (names, shapes,
dtypes), the schedule, the bucket size, buffers on or off, the frozen set and whether it is
averaged, and the optimizer (on or off, its type, the module's parameters it holds by name:
its state is averaged matched by name, so the optimizer may list them in another order). A
mismatch raises :class:`~dssync.errors.UsageError` on every rank, before the first byte of
parameter data moves, naming what rank 0 has, what the odd rank has, and the fix.

A rank that refuses the configuration by itself (a schedule that does not fit the world, such as
``Shuffle(3)`` on 2 ranks) does not raise alone: its refusal travels with its values, so every
rank raises the same error at once instead of waiting for a peer that left. The exchange waits
at most ``timeout_s``; a rank that never comes is named in a
:class:`~dssync.errors.PeerLost` (:mod:`dssync.comm.meta`).

Example::

    check_start(sync)      # inside DSSync.__init__, all ranks alike
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from dssync.comm.consensus import agree, module_fingerprint
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError


def _show(value: object) -> str:
    """What a rank shows the others of one setting (long values end in a fingerprint)."""
    return value if isinstance(value, str) else repr(value)


_hash = _show  # entries written as _hash(...) before values were shown, not hashed


def check_module(module: nn.Module) -> None:
    """Refuse what DS-Sync cannot wrap: no process group yet, or a module already wrapped by DDP."""
    if not dist.is_initialized():
        raise UsageError(
            "torch.distributed is not initialized: call dist.init_process_group() in the script "
            "before wrapping the model (torchrun starts the processes and sets the variables it "
            "reads, but does not create the group), or run it under `dssync train`"
        )
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        raise UsageError(
            "the model is wrapped in DistributedDataParallel, which would synchronize "
            "gradients as well; pass the plain module (ddp_model.module) to DSSync"
        )


def _outer(sync: Any) -> str | None:
    outer = getattr(sync, "outer", None)
    return None if outer is None else outer.describe()


def optimizer_layout(module: nn.Module, optimizer: Any) -> str:
    """What every rank's optimizer must hold alike: its type and the module's parameters it
    holds, by name in the module's order (DSSync averages their state matched by name, so the
    optimizer's own order may differ), then the shapes of any parameters outside the module,
    in the optimizer's order."""
    held = [p for g in optimizer.param_groups for p in g["params"]]
    ids = {id(p) for p in held}
    names = [n for n, p in module.named_parameters() if id(p) in ids]
    inside = {id(p) for p in module.parameters()}
    outside = [tuple(p.shape) for p in held if id(p) not in inside]
    text = f"{type(optimizer).__name__} over {', '.join(names) or 'no module parameters'}"
    if outside:
        text += f" and {len(outside)} outside the module of shapes {outside}"
    return text  # a long one is shown with its fingerprint (consensus._show, dssync.hashing)


def check_start(sync: Any, settings: dict[str, tuple[str, str]]) -> None:
    """Every rank of ``sync.process_group`` agrees on what shapes the collectives (collective):
    the model, schedule, optimizer and outer step read from ``sync``, and ``settings``, its own
    options as ``{label: (value shown, fix)}`` (:meth:`dssync.Options.agreement`)."""
    module = sync.module
    named = list(module.named_parameters()) + list(module.named_buffers())
    frozen = sorted(n for n, p in module.named_parameters() if not p.requires_grad)
    opt = getattr(sync, "optimizer", None)
    opt_layout = None if opt is None else optimizer_layout(module, opt)
    refusal, timeout_s = getattr(sync, "_refusal", None), sync.timeout_s
    if not timeout_s or timeout_s <= 0:
        refusal = f"timeout_s={timeout_s!r} must be a positive number of seconds"
        timeout_s = DEFAULT_TIMEOUT_S
    try:  # a schedule that cannot fit this world refuses here, on this rank alone
        schedule = f"{sync.schedule.describe()} #{sync.schedule.fingerprint(sync.world_size):x}"
    except (UsageError, ValueError) as e:
        schedule, refusal = sync.schedule.describe(), refusal or str(e)
    numel = sum(t.numel() for _, t in named)
    dtypes = " and ".join(sorted({str(t.dtype).removeprefix("torch.") for _, t in named}))
    shown = {
        "sync method": (
            _show(sync.name),
            "wrap the model with the same sync method (class) on every rank",
        ),
        "model (parameter and buffer names, shapes, dtypes)": (
            f"{len(named)} tensors of {numel} elements in {dtypes}, "
            f"{', '.join(n for n, _ in named)} #{module_fingerprint(named):x}",
            "build the same model on every rank before wrapping it",
        ),
        "schedule": (schedule, "give every rank the same schedule type, group size and seed"),
        "frozen parameters (requires_grad=False) and average_frozen": (
            _show((frozen, getattr(sync, "average_frozen", False))),
            "freeze the same parameters and pass the same average_frozen= on every rank",
        ),
        "optimizer (given or not, its type and the parameters it holds)": (
            _show(opt_layout),
            "pass optimizer= on every rank or on none, built over the same parameters (their "
            "order may differ: state is matched by name)",
        ),
        "outer optimizer (given or not, its type and settings)": (
            _show(_outer(sync)),
            "pass outer= on every rank or on none, built alike",
        ),
        **settings,
    }
    values = {k: v for k, (v, _) in shown.items()}
    fixes = {k: fix for k, (_, fix) in shown.items()}
    agree(values, sync.process_group, fixes, refusal, timeout_s)
