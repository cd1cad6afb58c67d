"""Processes as /proc shows them, for tests that check nothing a run started outlives it."""

from __future__ import annotations

from pathlib import Path


def _fields(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (state, parent, ...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _fields(stat.parent.name)
        if fields is not None and int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its exit status is left)."""
    fields = _fields(pid)
    return fields is not None and fields[0] != "Z"
