"""Resuming a run: which checkpoint step every rank resumes from, and whether it fits this run.

A run's identity is its header (:func:`run_header`): world size, workload, model layout and
synchronization method. A checkpoint whose header differs is refused with a one-line message
that names the difference and the fix. Damaged files are skipped with a warning; the ranks then
agree on the newest step that every rank holds intact.

Example (all ranks call it)::

    step = agree_on_step("ckpt", rank, run_header(cfg, world, module))
    if step is not None:
        header, state = read_checkpoint(checkpoint_path("ckpt", rank, step))
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from dssync.train.checkpoint import (
    CheckpointDamaged,
    CheckpointError,
    any_checkpoints,
    rank_checkpoints,
    read_header,
)
from dssync.train.config import TrainConfig

# header key -> (what it is, how to fix a mismatch)
_IDENTITY = {
    "world_size": ("workers", "resume with --workers {old} (or torchrun --nproc-per-node {old})"),
    "workload": ("workload", "resume with --workload {old}"),
    "workload_options": ("workload options", "resume with the same workload options"),
    "model": ("model layout", "resume with the same workload and model options"),
    "sync": ("synchronization method", "resume with --sync {old}"),
    "steps_per_epoch": ("steps per epoch", "resume with the same --batch-size and data"),
}


def run_header(cfg: TrainConfig, world: int, module: nn.Module | None = None) -> dict[str, Any]:
    """What a checkpoint must share with this run to be resumed by it."""
    header = {"world_size": world, "workload": cfg.workload, "sync": cfg.sync,
              "workload_options": json.loads(json.dumps(cfg.workload_options, sort_keys=True, default=str))}
    if module is not None:
        header["model"] = model_layout(module)
    return header


def model_layout(module: nn.Module) -> str:
    """A short text that changes with any parameter or buffer name, shape or dtype."""
    named = list(module.state_dict().items())
    text = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in named)
    n = sum(v.numel() for _, v in module.named_parameters())
    return f"{n} parameters, sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]}"


def check_fits(path: Path, found: dict[str, Any], expected: dict[str, Any]) -> None:
    """Raise CheckpointError when the checkpoint at ``path`` was written by a different kind of run."""
    for key, (what, fix) in _IDENTITY.items():
        if key in expected and key in found and found[key] != expected[key]:
            raise CheckpointError(
                f"checkpoint {path} was written with {what} {found[key]!r}, this run has "
                f"{expected[key]!r}; {fix.format(old=found[key])}, or use a new --checkpoint-dir"
            )


def preflight(folder: str | Path, expected: dict[str, Any]) -> None:
    """Cheap check before any worker starts: the newest rank-0 file's header fits this run.

    Only the header is read (no checksum, no model); workers verify everything again.
    """
    files = any_checkpoints(folder)
    if not files:
        return
    world = expected["world_size"]
    ranks = {int(p.name[4:7]) for p in files}
    if max(ranks) >= world:
        raise CheckpointError(
            f"checkpoint folder {folder} holds files of rank {max(ranks)}, written by more than this "
            f"run's {world} workers; resume with the world size that wrote it, or use a new --checkpoint-dir"
        )
    for path in sorted(rank_checkpoints(folder, 0).values(), reverse=True):
        try:
            found = read_header(path)
        except CheckpointError:
            continue  # damaged: the workers fall back or refuse, naming it
        check_fits(path, found, expected)
        return


def agree_on_step(folder: str | Path, rank: int, expected: dict[str, Any]) -> int | None:
    """The newest step whose checkpoint is intact on every rank, or None when there is none yet.

    All ranks call this. Damaged files are reported on stderr and skipped; a checkpoint from
    another kind of run, or files with no step intact everywhere, raise CheckpointError on every rank.
    """
    valid: list[int] = []
    damaged: list[str] = []
    error = None
    for step, path in sorted(rank_checkpoints(folder, rank).items(), reverse=True):
        try:
            check_fits(path, read_header(path), expected)
        except CheckpointDamaged as e:
            damaged.append(str(e))
            print(f"warning: rank {rank}: {e}", file=sys.stderr, flush=True)
            continue
        except CheckpointError as e:
            error = str(e)
            break
        valid.append(step)
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, (valid, damaged, error))
    for _, _, err in views:
        if err:
            raise CheckpointError(err)
    common = set.intersection(*(set(v) for v, _, _ in views))
    if common:
        return max(common)
    if not any(v or d for v, d, _ in views):
        return None
    for _, d, _ in views:
        if d:
            raise CheckpointError(d[0])
    have = "; ".join(f"rank {r} has steps {v}" for r, (v, _, _) in enumerate(views))
    raise CheckpointError(
        f"no checkpoint step in {folder} is intact on every rank ({have}); "
        "restore the missing files or start fresh with a new --checkpoint-dir"
    )
