"""How the CLI reports a failure: the user's input, a run out of step, or a bug.

The class of the exception decides, through its whole hierarchy, the same way whether it was
raised here or in a worker (a worker forwards the names of its exception's classes, see
:class:`dssync.lab.launch.WorkerError`):

* :class:`dssync.errors.UsageError`: one line ``error: ...``, exit 2;
* :class:`dssync.errors.SyncError` (and :class:`~dssync.errors.PeerLost`), or a worker that died or
  hung: one line naming the step, group and ranks, exit 1;
* anything else is a bug: its traceback, exit 1.
"""

from __future__ import annotations

import re
import sys
from typing import Literal

import click

from dssync.errors import SyncError, UsageError
from dssync.lab.launch import WorkerError, class_names

Kind = Literal["usage", "sync", "bug"]
_USAGE = f"{UsageError.__module__}.{UsageError.__qualname__}"
_SYNC = f"{SyncError.__module__}.{SyncError.__qualname__}"


def kind(e: BaseException) -> Kind:
    """``usage``, ``sync`` or ``bug``, by the classes of ``e`` (or of the worker's exception)."""
    if isinstance(e, WorkerError):
        if not e.exc_types:
            return "sync"  # the worker died or hung: it raised nothing we could classify
        names = e.exc_types
    else:
        names = class_names(e)
    if _USAGE in names:
        return "usage"
    if _SYNC in names:
        return "sync"
    return "bug"


def one_line(e: BaseException) -> str:
    """The first line of the exception's message (and the worker rank that reported it)."""
    if isinstance(e, WorkerError):
        text = e.message or e.detail
        first = (text.strip().splitlines() or ["failed"])[0]
        return f"worker rank {e.rank} failed: {first}"
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def report(e: BaseException) -> int:
    """Print ``e`` as its kind asks and return the exit code (2 for usage, 1 otherwise)."""
    k = kind(e)
    if k == "bug":
        detail = e.detail if isinstance(e, WorkerError) else None
        if detail:
            print(detail.rstrip(), file=sys.stderr)
            click.echo(f"error: {one_line(e)}", err=True)
        else:
            import traceback

            traceback.print_exception(e, file=sys.stderr)
        return 1
    click.echo(f"error: {as_flags(one_line(e))}", err=True)
    return 2 if k == "usage" else 1


# The library's errors name Python arguments (``every=``, ``timeout_s``); here they read as the
# flags that set them.
FLAGS = {
    "every": "--every",
    "wire": "--wire",
    "outer": "--outer",
    "overlap": "--overlap",
    "replan": "--replan",
    "fragments": "--fragments",
    "schedule": "--schedule",
    "group_size": "--group-size",
    "seed": "--seed",
    "timeout_s": "--timeout",
}
_ARGUMENT = re.compile(r"(?<![\w.-])(" + "|".join(FLAGS) + r")(=|(?![\w=]))")


def as_flags(text: str) -> str:
    """``text`` with each of the library's argument names the CLI sets written as its flag:
    ``every=0`` as ``--every=0``, ``pass the same wire=`` as ``pass the same --wire``."""

    def flag(m: re.Match) -> str:
        name, eq = m[1], m[2]
        if not eq and name != "timeout_s":  # a plain word ("every rank"), not the argument
            return m[0]
        follows = m.end() < len(text) and not text[m.end()].isspace() and text[m.end()] not in ",;)"
        return FLAGS[name] + ("=" if eq and follows else "")

    return _ARGUMENT.sub(flag, text)
