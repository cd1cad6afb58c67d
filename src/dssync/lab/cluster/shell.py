"""Run iproute2 commands with a timeout; check up front that we may build namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess

TIMEOUT_S = 15.0


class ClusterError(RuntimeError):
    """Building, changing or tearing down the emulated cluster failed; the message names the fix."""


def require_root_and_tools() -> None:
    """Raise ClusterError unless we run as root with ``ip``, ``tc`` and ``unshare`` on the PATH."""
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(
            f"the emulated cluster needs {' and '.join(missing)} (iproute2, util-linux), not "
            "found on PATH; install them (apt-get install iproute2 util-linux)"
        )
    if os.geteuid() != 0:
        raise ClusterError(
            "the emulated cluster needs root to create network namespaces; "
            "run as root (e.g. sudo) or use a single-host backend instead"
        )


def sh(args: list[str], timeout_s: float = TIMEOUT_S, check: bool = True) -> str:
    """Run ``args``; return stdout. On failure (and ``check``) raise ClusterError with stderr."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(args)}` took longer than {timeout_s} s") from None
    if check and done.returncode != 0:
        raise ClusterError(
            f"`{' '.join(args)}` failed (exit {done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout
