"""Start one ``torchrun`` agent per emulated host (:mod:`dssync.lab.cluster.torchrun`), wait for
all, and stop all of them on the first failure or on timeout.

torchrun's c10d rendezvous numbers the hosts itself (this torch sorts the joined nodes by name, so
``p-h10`` comes before ``p-h2``; other versions differ), so which global ranks share a host comes
from torchrun (RANK, LOCAL_RANK, GROUP_RANK, LOCAL_WORLD_SIZE) and the host name, never from the
spec's order.

Each agent runs in its own session; torchrun starts its workers in sessions of their own, so
stopping a run signals every agent's process group and then kills whatever is left in the host
namespaces (nothing else lives there). A failing host is named with the root cause torchrun
printed (the rank and its exit code).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dssync.lab.cluster.names import ClusterNames
from dssync.lab.cluster.shell import sh
from dssync.lab.cluster.torchrun import (
    LAUNCHER_VARS,
    free_port,
    host_command,
    host_env,
    torchrun_argv,
)

KILL_GRACE_S = 3.0
TIMEOUT_EXIT_CODE = 124
TAIL_LINES = 80


@dataclass(frozen=True)
class RunResult:
    """Outcome of a run: one torchrun exit code per host (negative: killed by that signal).

    ``failed_host`` is the first host whose torchrun was seen failing (None if all succeeded or
    on timeout); ``failed_rank`` and ``rank_exit_code`` are the root cause torchrun printed there
    (the global rank torchrun gave the worker, and its exit code), when it printed one.
    """

    returncodes: tuple[int | None, ...]
    failed_host: int | None
    timed_out: bool
    hosts: tuple[str, ...] = ()
    failed_rank: int | None = None
    rank_exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.failed_host is None and not self.timed_out

    @property
    def exit_code(self) -> int:
        """0 on success, the failing worker's (else torchrun's) exit code, or 124 on timeout."""
        if self.timed_out:
            return TIMEOUT_EXIT_CODE
        if self.failed_host is None:
            return 0
        code = self.rank_exit_code or self.returncodes[self.failed_host] or 1
        return code if code > 0 else 128 - code

    def host_name(self, host: int) -> str:
        return self.hosts[host] if host < len(self.hosts) else str(host)

    def summary(self) -> str:
        if self.timed_out:
            return f"timed out; torchrun exit codes by host: {list(self.returncodes)}"
        if self.failed_host is not None:
            h = self.failed_host
            code = self.returncodes[h]
            how = (
                f"was killed by signal {-code}"
                if code is not None and code < 0
                else (f"exited with code {code}")
            )
            cause = ""
            if self.failed_rank is not None:
                cause = f" (rank {self.failed_rank} exited with code {self.rank_exit_code})"
            return (
                f"host {h} ({self.host_name(h)}): torchrun {how}{cause}; "
                "every host's torchrun and workers were stopped"
            )
        return f"torchrun exited 0 on all {len(self.returncodes)} hosts"


ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank")
ROOT_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def root_cause(lines: list[str]) -> tuple[int | None, int | None]:
    """(rank, exit code) of the root cause in torchrun's failure report, or (None, None)."""
    starts = [i for i, line in enumerate(lines) if "Root Cause" in line]
    rank = code = None
    for line in lines[starts[-1] if starts else 0 :]:
        if m := ROOT_RANK.match(line):
            rank = int(m.group(1))
        elif (m := ROOT_CODE.match(line)) and rank is not None and code is None:
            code = int(m.group(1))
    return rank, code


class _Output:
    """Copies one agent's output, line by line, to a log file or our stdout; keeps the tail."""

    def __init__(self, pipe: IO[bytes], log: IO[bytes] | None) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._pipe, self._log = pipe, log
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        for raw in iter(self._pipe.readline, b""):
            self.tail.append(raw.decode(errors="replace").rstrip("\n"))
            if self._log is not None:
                self._log.write(raw)
                self._log.flush()
            else:
                sys.stdout.write(raw.decode(errors="replace"))
                sys.stdout.flush()

    def close(self, timeout_s: float = KILL_GRACE_S) -> None:
        self._thread.join(timeout_s)
        if self._log is not None:
            self._log.close()


class Agents:
    """The torchrun agents of a run, one per host, each in its own process session.

    Example::

        agents = cluster.launch([sys.executable, "-m", "dssync.lab.train.worker", cfg, out])
        result = agents.wait(timeout_s=600)   # stops every host if one fails or time runs out
        assert result.ok, result.summary()
    """

    def __init__(self, cluster: ClusterNames, procs: list[subprocess.Popen], outs: list[_Output]):
        self.cluster = cluster
        self.procs = procs
        self._outs = outs
        self._killed = False

    def wait(self, timeout_s: float) -> RunResult:
        """Wait for every host; on the first failure or after ``timeout_s``, stop all of them."""
        deadline = time.monotonic() + timeout_s
        try:
            while (result := self.poll(deadline)) is None:
                time.sleep(0.05)
        finally:
            self.kill()
        return result

    def poll(self, deadline: float) -> RunResult | None:
        """The run's outcome once every host finished, one failed or ``deadline`` (monotonic)
        passed, stopping every host then; None while it goes on."""
        codes = [p.poll() for p in self.procs]  # poll every one, no short cut
        bad = [h for h, c in enumerate(codes) if c not in (None, 0)]
        timed_out = not bad and None in codes and time.monotonic() > deadline
        if not bad and None in codes and not timed_out:
            return None
        self.kill()
        failed = bad[0] if bad else None
        rank = code = None
        if failed is not None:
            rank, code = root_cause(list(self._outs[failed].tail))
        return RunResult(
            tuple(p.returncode for p in self.procs),
            failed,
            timed_out,
            tuple(self.cluster.host_ns(h) for h in range(len(self.procs))),
            rank,
            code,
        )

    def kill(self) -> None:
        """SIGTERM every agent's process group (torchrun stops its workers), SIGKILL after a
        grace period, then kill anything still alive in the host namespaces. Safe to call twice."""
        if self._killed:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            live = [p for p in self.procs if p.poll() is None]
            for p in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, sig)
            end = time.monotonic() + KILL_GRACE_S
            while any(p.poll() is None for p in live) and time.monotonic() < end:
                time.sleep(0.05)
        for h in range(self.cluster.spec.num_hosts):
            kill_namespace(self.cluster.host_ns(h))
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=KILL_GRACE_S)
        for out in self._outs:
            out.close()
        self._killed = True


def kill_namespace(ns: str) -> None:
    """SIGKILL every process whose network namespace is ``ns``."""
    for pid in sh(["ip", "netns", "pids", ns], check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def start_agents(
    cluster: ClusterNames,
    argv: list[str],
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    join_timeout_s: float = 600.0,
    max_restarts: int = 0,
) -> Agents:
    """Start one torchrun agent per host running ``argv`` on each of its workers.

    ``env`` adds to (and overrides) the inherited environment; ``max_restarts`` is torchrun's
    ``--max-restarts``. With ``log_dir``, host h's torchrun
    output (its workers' output included) goes to ``log_dir/host<h>.log``; otherwise to stdout.
    """
    port = free_port(cluster)
    run_id = f"{cluster.prefix}-{secrets.token_hex(3)}"
    command = torchrun_argv(cluster, port, run_id, argv, join_timeout_s, max_restarts)
    base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    procs: list[subprocess.Popen] = []
    outs: list[_Output] = []
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    try:
        for host in range(cluster.spec.num_hosts):
            log = None
            if log_dir is not None:
                log = open(Path(log_dir) / f"host{host}.log", "wb")  # noqa: SIM115
            proc = subprocess.Popen(
                host_command(cluster, host, command),
                env={**base, **(env or {}), **host_env(cluster, host)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(proc)
            assert proc.stdout is not None
            outs.append(_Output(proc.stdout, log))
    except BaseException:
        Agents(cluster, procs, outs).kill()
        raise
    return Agents(cluster, procs, outs)
