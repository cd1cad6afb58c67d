"""Running the real `dssync` CLI in a subprocess that cannot outlive its test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

DIGITS = ["--workload", "digits", "--workers", "2", "--epochs", "1", "--quiet"]
FAULT_CLI = str(
    Path(__file__).with_name("fault_cli.py")
)  # the CLI with --crash-rank/--crash-at-step


def run(
    args: list[str], timeout: float = 120, module: str | None = "dssync"
) -> subprocess.CompletedProcess:
    """``python -m <module> *args`` (``python *args`` without a module); on timeout the whole
    process group (workers too) is killed."""
    head = [sys.executable, "-m", module] if module else [sys.executable]
    proc = subprocess.Popen(
        [*head, *args],
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


def load(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
