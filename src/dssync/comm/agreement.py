"""Start-up agreement: before any averaging, every rank checks it shapes the collectives alike.

One all-gather of a few 63-bit fingerprints (:func:`dssync.comm.consensus.fingerprint_check`,
over the side group) compares what decides the number, size, dtype and order of the buffers each
step moves: the sync method (blocking and overlapped DS-Sync make different groups and tags),
how pairs average (``pairs=``: groups made per pair or none), the model (names, shapes,
dtypes), the schedule, the bucket size, buffers on or off, the frozen set and whether it is
averaged, and the optimizer (on or off, its type, the shapes of its parameter groups). A
mismatch raises :class:`~dssync.errors.UsageError` naming the odd rank and the fix, on every
rank, before the first byte of parameter data moves.

Example::

    check_start(sync)      # inside DSSync.__init__, all ranks alike
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import nn

from dssync.comm.consensus import fingerprint_check, module_fingerprint
from dssync.errors import UsageError
from dssync.hashing import fingerprint


def _hash(value: object) -> int:
    return fingerprint(repr(value))


def check_module(module: nn.Module) -> None:
    """Refuse what DS-Sync cannot wrap: no process group yet, or a module already wrapped by DDP."""
    if not dist.is_initialized():
        raise UsageError(
            "torch.distributed is not initialized; call dist.init_process_group() first, "
            "or start the workers with `dssync train` or torchrun"
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


def check_start(sync: Any) -> None:
    """Every rank of ``sync.process_group`` agrees on what shapes the collectives (collective)."""
    module = sync.module
    named = list(module.named_parameters()) + list(module.named_buffers())
    frozen = sorted(n for n, p in module.named_parameters() if not p.requires_grad)
    opt = sync.optimizer
    opt_layout = (
        None
        if opt is None
        else (type(opt).__name__, [[tuple(p.shape) for p in g["params"]] for g in opt.param_groups])
    )
    values = {
        "sync method": _hash(sync.name),
        "pairs (exchange or all_reduce)": _hash(getattr(sync, "pairs", "exchange")),
        "model (parameter and buffer names, shapes, dtypes)": module_fingerprint(named),
        "schedule": sync.schedule.fingerprint(sync.world_size),
        "bucket_bytes": _hash(sync.bucket_bytes),
        "average_buffers": _hash(sync.average_buffers),
        "frozen parameters (requires_grad=False) and average_frozen": _hash(
            (frozen, sync.average_frozen)
        ),
        "optimizer (given or not, its type and parameter shapes)": _hash(opt_layout),
        "every (optimizer steps per averaging)": _hash(getattr(sync, "every", 1)),
        "overlap": _hash(getattr(sync, "overlap", False)),
        "replan (averagings between re-plans)": _hash(getattr(sync, "replan", 0)),
        "outer optimizer (given or not, its type and settings)": _hash(_outer(sync)),
    }
    fixes = {
        "sync method": "wrap the model with the same sync method (class) on every rank",
        "pairs (exchange or all_reduce)": "pass the same pairs= on every rank",
        "model (parameter and buffer names, shapes, dtypes)": "build the same model on every rank before wrapping it",
        "schedule": "give every rank the same schedule type, group size and seed",
        "bucket_bytes": "pass the same bucket_bytes on every rank",
        "average_buffers": "pass the same average_buffers on every rank",
        "frozen parameters (requires_grad=False) and average_frozen": "freeze the same parameters and pass the same average_frozen on every rank",
        "optimizer (given or not, its type and parameter shapes)": "pass optimizer= on every rank or on none, built alike",
        "every (optimizer steps per averaging)": "pass the same every= (--every) on every rank",
        "overlap": "pass the same overlap= (--overlap) on every rank",
        "replan (averagings between re-plans)": "pass the same replan= (--replan) on every rank",
        "outer optimizer (given or not, its type and settings)": "pass outer= (--outer) on every rank or on none, built alike",
    }
    try:
        fingerprint_check(values, group=sync.process_group, fixes=fixes)
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None
