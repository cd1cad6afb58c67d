"""Which failures are the user's input (exit 2, one line) rather than dssync's own bugs."""

from __future__ import annotations

from dssync.launch import WorkerError

# Exceptions that mean bad input, by type name (a worker forwards its exception's name).
USER_ERROR_TYPES = {"ValueError", "FileNotFoundError", "NotADirectoryError", "IsADirectoryError",
                    "FileExistsError", "ClusterSpecError", "CheckpointError", "CheckpointDamaged",
                    "UsageError"}


def is_user_error(e: BaseException) -> bool:
    if isinstance(e, WorkerError):
        return e.exc_type in USER_ERROR_TYPES
    return any(t.__name__ in USER_ERROR_TYPES for t in type(e).__mro__)


def user_error_message(e: BaseException) -> str:
    """One line: the exception's first line (and the worker rank that reported it)."""
    if isinstance(e, WorkerError):
        first = (e.message.strip().splitlines() or [e.exc_type])[0]
        return f"{first} (reported by worker rank {e.rank})"
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def worker_failure(e: WorkerError) -> Exception:
    """A worker's failure as the CLI reports it.

    Bad input stays as it is (exit 2, one line). A worker that died, hung or crashed becomes a
    ClickException (exit 1) whose message names the rank; its traceback goes to stderr first.
    """
    if is_user_error(e):
        return e
    import sys

    import click

    if "Traceback" in e.detail and e.exc_type not in ("WorkerLostError", "WorkerDied"):
        print(e.detail.rstrip(), file=sys.stderr)
    first = (e.message.strip().splitlines() or e.detail.strip().splitlines() or ["failed"])[0]
    return click.ClickException(f"worker rank {e.rank} failed: {first}")
