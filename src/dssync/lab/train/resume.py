"""Which checkpoint a resumed run continues from, agreed by all ranks.

A checkpoint fits a run when they share its identity (:func:`run_header`): workload, model layout,
synchronization method, per-worker batch size and data size. The world size may differ: a run
written by N workers resumes with M (see :mod:`dssync.lab.train.state`). A checkpoint whose identity
differs is refused with a one-line message that names the difference and the fix. A file must
also be the one its name says and belong to this run: its header's rank and step are those of
its name (:func:`check_own`: a file copied over another rank's, or renamed to another step, is
refused as such), and every file of the step agreed on records the same run identity
(:func:`check_one_run`; the identity is chosen at a run's first start and kept by every resume,
:class:`dssync.lab.train.state.Checkpointer`). Damaged files are skipped with a warning; the ranks
then agree on the newest step at which every rank of the run that wrote it left an intact file.
A refused resume writes nothing.

Example (all ranks call it)::

    found = agree_on_step("ckpt", rank, run_header(cfg, world, module))
    if found is not None:
        step, saved_world = found
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from dssync.comm.side import side_group
from dssync.lab.config import TrainConfig
from dssync.lab.train.checkpoint import (
    CheckpointDamaged,
    CheckpointError,
    any_checkpoints,
    checkpoint_path,
    name_parts,
    rank_checkpoints,
    read_header,
)

# header key -> (what it is, how to fix a mismatch)
_IDENTITY = {
    "workload": ("workload", "resume with --workload {old}"),
    "workload_options": ("workload options", "resume with the same workload options"),
    "model": ("model layout", "resume with the same workload and model options"),
    "sync": ("synchronization method", "resume with --sync {old}"),
    "batch_size": ("per-worker batch size", "resume with --batch-size {old}"),
    "train_samples": ("training samples", "resume with the same data"),
}


def run_header(cfg: TrainConfig, world: int, module: nn.Module | None = None) -> dict[str, Any]:
    """What a checkpoint records about the run that wrote it (see :data:`_IDENTITY` for what must match)."""
    header = {
        "world_size": world,
        "workload": cfg.workload,
        "sync": cfg.sync,
        "workload_options": json.loads(
            json.dumps(cfg.workload_options, sort_keys=True, default=str)
        ),
    }
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


def check_own(path: Path, header: dict[str, Any]) -> None:
    """Raise CheckpointError when the file at ``path`` is not the one its name says: a file
    renamed to another step, or copied over another rank's (the header holds what was written)."""
    parts = name_parts(path)
    if parts is None or "rank" not in header or "step" not in header:
        return
    rank, step = parts
    if header["step"] != step:
        raise CheckpointError(
            f"checkpoint {path} was renamed: its name says step {step}, it holds rank "
            f"{header['rank']}'s state of step {header['step']}; give it back its own name "
            f"({checkpoint_path(path.parent, header['rank'], header['step']).name}) or move it "
            "out of the folder, or use a new --checkpoint-dir"
        )
    if header["rank"] != rank:
        raise CheckpointError(
            f"checkpoint {path} holds rank {header['rank']}'s state, not rank {rank}'s (a file "
            f"copied or renamed over another rank's); put rank {rank}'s own file of step {step} "
            "back, or move this step's files out of the folder to resume from an older step, or "
            "use a new --checkpoint-dir"
        )


def check_one_run(step: int, runs: dict[Path, str | None]) -> None:
    """Raise CheckpointError when the files of ``step`` (path: the run identity in its header)
    were written by different runs, naming the odd files and both identities."""
    ids = list(runs.values())
    if len(set(ids)) < 2:
        return
    common = max(ids, key=lambda v: (ids.count(v), -ids.index(v)))
    odd = [p for p, v in runs.items() if v != common]
    shown = ", ".join(f"{p} (run {runs[p]})" for p in odd[:3])
    raise CheckpointError(
        f"checkpoint {shown} belongs to another run than the other files of step {step} (run "
        f"{common}): a file taken from another run's folder; put this run's own file back, or "
        "move this step's files out of the folder to resume from an older step, or use a new "
        "--checkpoint-dir"
    )


def preflight(folder: str | Path, expected: dict[str, Any]) -> None:
    """Cheap check before any worker starts: the newest intact rank-0 file fits this run.

    Workers verify every file again.
    """
    rank0 = sorted((p for p in any_checkpoints(folder) if name_parts(p)[0] == 0), reverse=True)
    for path in rank0:
        try:
            found = read_header(path)
        except CheckpointDamaged:
            continue  # the workers fall back or refuse, naming it
        check_fits(path, found, expected)
        return


def newest_complete(folder: str | Path, expected: dict[str, Any]) -> tuple[int, int] | None:
    """(step, world size) of the newest step where every rank that wrote it left an intact file.

    Damaged files are named on stderr and skipped. Raises CheckpointError for a file of another kind
    of run, or when files exist but no step is complete.
    """
    by_step: dict[int, dict[int, Path]] = {}
    for p in any_checkpoints(folder):
        rank, step = name_parts(p)
        by_step.setdefault(step, {})[rank] = p
    damaged: list[str] = []
    for step in sorted(by_step, reverse=True):
        world = None
        intact = set()
        runs: dict[Path, str | None] = {}
        for rank, path in sorted(by_step[step].items()):
            try:
                header = read_header(path)
            except CheckpointDamaged as e:
                damaged.append(str(e))
                continue
            check_fits(path, header, expected)
            check_own(path, header)
            runs[path] = header.get("run")
            world = header["world_size"]
            intact.add(rank)
        if world is not None and intact == set(range(world)):
            check_one_run(step, runs)
            for d in damaged:
                print(f"warning: {d}", file=sys.stderr, flush=True)
            return step, world
    if not by_step:
        return None
    if damaged:
        raise CheckpointError(damaged[0])
    have = "; ".join(f"step {s}: ranks {sorted(r)}" for s, r in sorted(by_step.items()))
    raise CheckpointError(
        f"no checkpoint step in {folder} is intact on every rank that wrote it ({have}); "
        "restore the missing files or start fresh with a new --checkpoint-dir"
    )


def own_steps(
    folder: str | Path, rank: int, expected: dict[str, Any]
) -> tuple[dict[int, int], list[str], dict[int, str | None]]:
    """({step: world size that wrote it} for this rank's own intact files that fit this run,
    the messages naming its damaged files, {step: the run identity its file records}).

    Damaged files are also named on stderr and skipped; a file of another kind of run, or one
    renamed or copied over another rank's (:func:`check_own`), raises.
    """
    found, damaged, runs = {}, [], {}
    for step, path in sorted(rank_checkpoints(folder, rank).items(), reverse=True):
        try:
            header = read_header(path)
        except CheckpointDamaged as e:
            print(f"warning: rank {rank}: {e}", file=sys.stderr, flush=True)
            damaged.append(str(e))
            continue
        check_fits(path, header, expected)
        check_own(path, header)
        found[step] = header["world_size"]
        runs[step] = header.get("run")
    return found, damaged, runs


def agree_on_step(
    folder: str | Path, rank: int, expected: dict[str, Any]
) -> tuple[int, int] | None:
    """(step, world size that wrote it) to resume from, the same on every rank; None: start fresh.

    All ranks call this. Each rank checks its own files, so with an unchanged world size the
    folder may be local to each machine. When the newest checkpoint was written by another number
    of workers, every rank reads all of its files (:func:`newest_complete`): the folder must then
    be one every rank shares.
    """
    world = dist.get_world_size()
    try:
        mine: Any = own_steps(folder, rank, expected)
    except CheckpointError as e:
        mine = str(e)
    gathered = _gather(mine)
    views = [v for v, _, _ in gathered]
    damaged = [d for _, ds, _ in gathered for d in ds]
    same = [s for s, w in views[0].items() if w == world and all(v.get(s) == w for v in views)]
    elastic = [s for v in views for s, w in v.items() if w != world]
    if elastic and max(elastic) > max(same, default=-1):
        try:
            found: Any = (
                newest_complete(folder, expected) if rank == 0 else _quiet(folder, expected)
            )
        except CheckpointError as e:
            found = str(e)
        views = _gather(found)
        if any(v != views[0] for v in views):
            seen = "; ".join(f"rank {r} sees {v}" for r, v in enumerate(views))
            raise CheckpointError(
                f"the ranks see different checkpoints in {folder} ({seen}); a run resumed with another "
                "number of workers needs a --checkpoint-dir every rank shares"
            )
        return None if views[0] is None else tuple(views[0])
    if same:
        step = max(same)
        paths = saved_files(folder, step, world)
        check_one_run(step, {paths[r]: runs.get(step) for r, (_, _, runs) in enumerate(gathered)})
        return step, world
    if not any(v for v in views) and not damaged:
        return None  # decided from what every rank saw, so all ranks decide alike
    if damaged:
        raise CheckpointError(damaged[0])
    have = "; ".join(f"rank {r} has steps {sorted(v)}" for r, v in enumerate(views))
    raise CheckpointError(
        f"no checkpoint step in {folder} is intact on every rank ({have}); "
        "restore the missing files or start fresh with a new --checkpoint-dir"
    )


def _gather(mine: Any) -> list[Any]:
    """Every rank's ``mine``; a string is an error one rank hit, raised on all of them."""
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine, group=side_group())  # metadata: gloo, never nccl
    for v in views:
        if isinstance(v, str):
            raise CheckpointError(v)
    return views


def saved_files(folder: str | Path, step: int, world: int) -> list[Path]:
    """The files of every rank that wrote ``step``, by rank."""
    return [checkpoint_path(folder, r, step) for r in range(world)]


def _quiet(folder: str | Path, expected: dict[str, Any]) -> tuple[int, int] | None:
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        return newest_complete(folder, expected)
