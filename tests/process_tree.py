"""Processes as /proc shows them, for tests that check nothing a run started outlives it
(``children`` is the launcher's own)."""

from __future__ import annotations

from pathlib import Path

from dssync.lab.launch import children  # noqa: F401 - the tests import it from here


def _fields(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (state, parent, ...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its exit status is left)."""
    fields = _fields(pid)
    return fields is not None and fields[0] != "Z"
