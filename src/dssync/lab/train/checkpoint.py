"""Checkpoint files: one per rank and step, written atomically, verified by a checksum.

File ``rank{R:03d}-step{S:09d}.ckpt`` in the checkpoint folder is three parts::

    DSSYNC-CHECKPOINT 1 <sha256 hex> <header bytes> <payload bytes>\\n
    <header: JSON with step, rank, world_size, workload, model, sync>
    <payload: torch.save of the training state: tensors and plain data only>

The sha256 covers header and payload, so a truncated or altered file is refused. A file is
written to a temporary name in the same folder, fsynced, renamed over the final name, and the
folder is fsynced, so a crash leaves either the old file or the new one, never half of one.

A checkpoint is data, not code: the payload is read with ``torch.load(..., weights_only=True)``,
which builds tensors, numbers, strings and containers but never calls an arbitrary class, so a
crafted file (whose checksum anyone can recompute) cannot run code on the ranks that resume from it.

Example::

    path = write_checkpoint("ckpt", rank=0, step=100, header={"world_size": 2}, state={"x": 1})
    header, state = read_checkpoint(path)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from dssync.errors import UsageError
from dssync.saving import write_atomic

MAGIC = b"DSSYNC-CHECKPOINT"
VERSION = 1
KEEP = 2
_NAME = re.compile(r"^rank(\d+)-step(\d+)\.ckpt$")


class CheckpointError(UsageError):
    """A checkpoint is damaged or belongs to another run; the message names the file and the fix."""


class CheckpointDamaged(CheckpointError):
    """A checkpoint file fails its checksum or is truncated."""


def checkpoint_path(folder: str | Path, rank: int, step: int) -> Path:
    return Path(folder) / f"rank{rank:03d}-step{step:09d}.ckpt"


def write_checkpoint(
    folder: str | Path,
    rank: int,
    step: int,
    header: dict[str, Any],
    state: dict[str, Any],
    keep: int = KEEP,
) -> Path:
    """Write this rank's state at ``step`` atomically, then drop all but its ``keep`` newest files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    head = json.dumps({**header, "step": step, "rank": rank}, sort_keys=True).encode()
    digest = hashlib.sha256(head + payload).hexdigest()
    first = b"%s %d %s %d %d\n" % (MAGIC, VERSION, digest.encode(), len(head), len(payload))
    path = checkpoint_path(folder, rank, step)
    write_atomic(path, first + head + payload)
    _fsync_dir(folder)
    for _, old in sorted(rank_checkpoints(folder, rank).items())[:-keep]:
        old.unlink(missing_ok=True)
    return path


def read_header(path: str | Path) -> dict[str, Any]:
    """The header alone, verified against the checksum; raises CheckpointError if damaged."""
    return _read(Path(path))[0]


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, state) of a verified checkpoint; raises CheckpointError if it is damaged."""
    header, payload = _read(Path(path))
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"checkpoint {path} holds objects other than tensors and plain data, so it was not "
            "loaded; delete it (an older checkpoint, if any, is used) or use a new --checkpoint-dir"
        ) from None
    except Exception as e:  # noqa: BLE001 - any other failure to load means a damaged file
        raise _damaged(Path(path), f"its payload does not load ({type(e).__name__})") from None
    return header, state


def name_parts(path: str | Path) -> tuple[int, int] | None:
    """(rank, step) from a checkpoint file's name, or None for any other file."""
    m = _NAME.match(Path(path).name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def rank_checkpoints(folder: str | Path, rank: int) -> dict[int, Path]:
    """This rank's checkpoint files by step (not verified)."""
    found = {}
    folder = Path(folder)
    if not folder.is_dir():
        return found
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m and int(m.group(1)) == rank:
            found[int(m.group(2))] = p
    return found


def any_checkpoints(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name)) if folder.is_dir() else []


def _read(path: Path) -> tuple[dict[str, Any], bytes]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(
            f"cannot read checkpoint {path}: {e.strerror}; check the file's permissions"
        ) from None
    line, sep, rest = data.partition(b"\n")
    parts = line.split(b" ")
    if not sep or len(parts) != 5 or parts[0] != MAGIC:
        raise _damaged(path, "it does not start with a dssync checkpoint header")
    if parts[1] != str(VERSION).encode():
        raise CheckpointError(
            f"checkpoint {path} has format version {parts[1].decode(errors='replace')}, this dssync "
            f"reads version {VERSION}; resume with the dssync version that wrote it, or use a new --checkpoint-dir"
        )
    try:
        n_head, n_payload = int(parts[3]), int(parts[4])
    except ValueError:
        raise _damaged(path, "its header line is garbled") from None
    if len(rest) != n_head + n_payload:
        raise _damaged(
            path,
            f"it holds {len(rest)} bytes after the header, {n_head + n_payload} expected (truncated?)",
        )
    if hashlib.sha256(rest).hexdigest().encode() != parts[2]:
        raise _damaged(path, "its sha256 checksum does not match")
    try:
        header = json.loads(rest[:n_head])
    except ValueError:
        raise _damaged(path, "its header is not JSON") from None
    return header, rest[n_head:]


def _damaged(path: Path, why: str) -> CheckpointDamaged:
    return CheckpointDamaged(
        f"checkpoint {path} is damaged: {why}; delete it (an older checkpoint, if any, is used) "
        "or start fresh with a new --checkpoint-dir"
    )


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
