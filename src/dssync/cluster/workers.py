"""Start one process per worker inside its host namespace, wait for all, kill all on failure."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dssync.cluster.names import ClusterNames
from dssync.cluster.shell import sh

KILL_GRACE_S = 3.0
TIMEOUT_EXIT_CODE = 124


def rank_env(cluster: ClusterNames, rank: int, master_port: int) -> dict[str, str]:
    """The environment variables worker ``rank`` gets (torch.distributed's env:// names)."""
    spec = cluster.spec
    host = spec.host_of_rank(rank)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_RANK": str(spec.local_rank(rank)),
        "LOCAL_WORLD_SIZE": str(spec.workers_per_host),
        "GROUP_RANK": str(host),
        "MASTER_ADDR": cluster.address_of(0),
        "MASTER_PORT": str(master_port),
        "GLOO_SOCKET_IFNAME": cluster.host_ifname(host),
        "DSSYNC_HOST": str(host),
        "DSSYNC_RACK": str(spec.rack_of_host(host)),
        "DSSYNC_CLUSTER": cluster.prefix,
    }


def free_port(cluster: ClusterNames, host: int = 0) -> int:
    """A TCP port that is free on ``host`` (asked inside its namespace)."""
    code = "import socket; s=socket.socket(); s.bind(('',0)); print(s.getsockname()[1])"
    out = sh(["ip", "netns", "exec", cluster.host_ns(host), sys.executable, "-c", code])
    return int(out.strip())


@dataclass(frozen=True)
class RunResult:
    """Outcome of a run: one exit code per rank (negative: killed by that signal).

    ``failed_rank`` is the first rank seen failing (None if all succeeded or on timeout).
    """

    returncodes: tuple[int | None, ...]
    failed_rank: int | None
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.failed_rank is None and not self.timed_out

    @property
    def exit_code(self) -> int:
        """0 on success, the first failing rank's exit code, or 124 on timeout."""
        if self.timed_out:
            return TIMEOUT_EXIT_CODE
        if self.failed_rank is None:
            return 0
        code = self.returncodes[self.failed_rank] or 1
        return code if code > 0 else 128 - code

    def summary(self) -> str:
        if self.timed_out:
            return f"timed out; exit codes by rank: {list(self.returncodes)}"
        if self.failed_rank is not None:
            return (
                f"rank {self.failed_rank} failed with exit code "
                f"{self.returncodes[self.failed_rank]}; the other ranks were stopped"
            )
        return f"all {len(self.returncodes)} ranks exited 0"


class Workers:
    """Running worker processes, one per rank, each in its own process group.

    Example::

        workers = cluster.launch([sys.executable, "-c", "print('hi')"])
        result = workers.wait(timeout_s=30)   # kills the rest if one fails or time runs out
        assert result.ok, result.summary()
    """

    def __init__(self, procs: list[subprocess.Popen], logs: list[IO[bytes]]) -> None:
        self.procs = procs
        self._logs = logs

    def wait(self, timeout_s: float) -> RunResult:
        """Wait for all ranks; on the first failure or after ``timeout_s``, stop all others."""
        deadline = time.monotonic() + timeout_s
        failed: int | None = None
        timed_out = False
        try:
            while None in [p.poll() for p in self.procs]:  # poll every one, no short cut
                bad = [r for r, p in enumerate(self.procs) if p.returncode not in (None, 0)]
                if bad:
                    failed = bad[0]
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.05)
            else:
                bad = [r for r, p in enumerate(self.procs) if p.returncode != 0]
                failed = bad[0] if bad else None
        finally:
            self.kill()
        return RunResult(tuple(p.returncode for p in self.procs), failed, timed_out)

    def kill(self) -> None:
        """SIGTERM every live process group, then SIGKILL after a grace period."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            live = [p for p in self.procs if p.poll() is None]
            for p in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, sig)
            end = time.monotonic() + KILL_GRACE_S
            while any(p.poll() is None for p in live) and time.monotonic() < end:
                time.sleep(0.05)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=KILL_GRACE_S)
        for log in self._logs:
            log.close()
        self._logs = []


def start_workers(
    cluster: ClusterNames,
    argv: list[str],
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    master_port: int | None = None,
) -> Workers:
    """Start ``argv`` once per rank with ``ip netns exec <host ns>`` and the rank's env.

    ``env`` adds to (and overrides) the inherited environment. With ``log_dir``, rank r's
    stdout and stderr go to ``log_dir/rank<r>.log``; otherwise they are inherited.
    """
    port = master_port or free_port(cluster)
    procs: list[subprocess.Popen] = []
    logs: list[IO[bytes]] = []
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    try:
        for rank in range(cluster.spec.world_size):
            full_env = {**os.environ, **(env or {}), **rank_env(cluster, rank, port)}
            out = None
            if log_dir is not None:
                out = open(Path(log_dir) / f"rank{rank}.log", "wb")  # noqa: SIM115
                logs.append(out)
            ns = cluster.host_ns(cluster.spec.host_of_rank(rank))
            procs.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, *argv],
                    env=full_env,
                    stdout=out,
                    stderr=subprocess.STDOUT if out else None,
                    start_new_session=True,
                )
            )
    except BaseException:
        Workers(procs, logs).kill()
        raise
    return Workers(procs, logs)
