"""Running the real `dssync` CLI in a subprocess that cannot outlive its test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from dssync.lab.launch import run_contained

DIGITS = ["--workload", "digits", "--workers", "2", "--epochs", "1", "--quiet"]
FAULT_CLI = str(
    Path(__file__).with_name("fault_cli.py")
)  # the CLI with --crash-rank/--crash-at-step


def run(
    args: list[str], timeout: float = 120, module: str | None = "dssync"
) -> subprocess.CompletedProcess:
    """``python -m <module> *args`` (``python *args`` without a module), contained: on timeout
    the whole process group (workers too) is killed and TimeoutError raised."""
    head = [sys.executable, "-m", module] if module else [sys.executable]
    return run_contained([*head, *args], timeout)


def load(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
