"""Starting commands that cannot outlive their test: each runs in a session of its own, and the
whole process group (workers, torchrun's ranks) is killed when it ends or times out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``python *args``; raises AssertionError (after killing everything) on timeout."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"`{' '.join(args)}` did not finish in {timeout}s; stderr:\n{err[-3000:]}"
        ) from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the session, if any
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
