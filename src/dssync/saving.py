"""Per-rank checkpoint files for a plain training script: ``torch.save`` and ``torch.load`` with a
checksum and the rank that wrote the file.

Between averages every rank holds its own model, so each rank saves its own file. A file with
flipped bytes loaded by ``torch.load`` gives its bad values to the model, and DS-Sync then averages
them into every rank it meets; a file copied from another rank gives that rank's model and
optimizer state. :func:`save` writes a sha256 of the payload and the rank (and world size) that
wrote it in front of ``torch.save``'s bytes, atomically (a temporary file renamed over the name);
:func:`load` verifies both before a byte is unpickled, then loads with ``weights_only=True`` (data,
not code). Needs torch only.

Example (every rank, after ``dist.init_process_group``)::

    dssync.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                 "sync": sync.state_dict()}, f"{folder}/rank{rank}.pt")
    state = dssync.load(f"{folder}/rank{rank}.pt")   # UsageError if damaged or another rank's
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dssync.errors import UsageError

MAGIC = b"DSSYNC-SAVE"
VERSION = 1


def save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` with a sha256 checksum and this rank's number, written atomically."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    rank, world = _where()
    digest = hashlib.sha256(b"%d %d " % (rank, world) + payload).hexdigest().encode()
    head = b"%s %d %d %d %s %d\n" % (MAGIC, VERSION, rank, world, digest, len(payload))
    write_atomic(Path(path), head + payload)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temporary file beside it, synced, then
    renamed over it (a crash leaves the old file, or none)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str | os.PathLike, map_location: Any = None, *, any_rank: bool = False) -> Any:
    """What :func:`save` wrote at ``path``, verified: a damaged or truncated file, or (unless
    ``any_rank=True``) one another rank wrote, raises :class:`~dssync.errors.UsageError` naming
    the file. Loaded with ``torch.load(..., weights_only=True)``."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read checkpoint {path}: {e.strerror}") from None
    line, sep, payload = data.partition(b"\n")
    parts = line.split(b" ")
    if not sep or len(parts) != 6 or parts[0] != MAGIC or parts[1] != b"%d" % VERSION:
        raise UsageError(
            f"checkpoint {path} was not written by dssync.save (or is damaged at its start); "
            "load it with torch.load, or save it again with dssync.save"
        )
    try:
        rank, world, size = int(parts[2]), int(parts[3]), int(parts[5])
    except ValueError:
        raise _damaged(path, "its header line is garbled") from None
    if len(payload) != size:
        raise _damaged(path, f"it holds {len(payload)} bytes of data, {size} expected (truncated?)")
    if hashlib.sha256(b"%d %d " % (rank, world) + payload).hexdigest().encode() != parts[4]:
        raise _damaged(path, "its sha256 checksum does not match")
    mine, _ = _where()
    if not any_rank and rank != mine:
        raise UsageError(
            f"checkpoint {path} was saved by rank {rank}, this is rank {mine}: each rank loads "
            "its own file (e.g. f'{folder}/rank{rank}.pt'); pass any_rank=True to load another "
            "rank's on purpose"
        )
    return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)


def _where() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _damaged(path: Any, why: str) -> UsageError:
    return UsageError(
        f"checkpoint {path} is damaged: {why}; load an older checkpoint, or start again from "
        "the last good one"
    )
