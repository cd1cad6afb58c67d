"""Starting commands that cannot outlive their test (see :func:`dssync.lab.launch.run_contained`)."""

from __future__ import annotations

import subprocess
import sys

from dssync.lab.launch import run_contained


def run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``python *args`` in a session of its own; raises TimeoutError (after killing it all)."""
    return run_contained([sys.executable, *args], timeout)
