"""A Lighthouse and replicas as local processes, each killed when the test ends.

Every process starts in a session of its own and ends by its own deadline too (``signal.alarm``
in ``replica.py``; the Lighthouse when the test's process ends), so nothing outlives a test that
was itself killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dssync.lab.elastic.launch import Lighthouse, step_records

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"


class Cluster:
    """Start, watch and kill the processes of one test; :meth:`close` kills what is left."""

    def __init__(self, tmp: Path, heartbeat_ms: int = 2000, deadline_s: float = 240.0) -> None:
        self.tmp = tmp
        self.log = tmp / "steps.jsonl"
        self.go = tmp / "go"
        self.heartbeat_ms = heartbeat_ms
        self.deadline_s = deadline_s
        self.procs: list[subprocess.Popen] = []
        self.replicas: dict[int, subprocess.Popen] = {}
        self.address = ""
        self.house: Lighthouse | None = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}

    def lighthouse(self, min_replicas: int = 2, join_ms: int = 30000, wait_s: float = 60) -> str:
        """The lab's Lighthouse process (dssync.lab.elastic.launch), killed by :meth:`close`."""
        self.house = Lighthouse(self.tmp, min_replicas, join_ms, self.heartbeat_ms, wait_s)
        self.address = self.house.address
        return self.address

    def replica(self, n: int, steps: int, *extra: str, go: Path | None = None) -> subprocess.Popen:
        """Start replica ``n``; it joins when ``go`` (default: :attr:`go`) exists."""
        cmd = [
            sys.executable,
            str(HERE / "replica.py"),
            f"--replica={n}",
            f"--lighthouse={self.address}",
            f"--steps={steps}",
            f"--log={self.log}",
            f"--deadline-s={self.deadline_s}",
            *extra,
        ]
        cmd.append(f"--go={go or self.go}")
        if go is None and not self.go.exists():  # started together: the first quorum has all
            cmd.append("--manager-first")
        proc = self._start(cmd, f"replica{n}")
        self.replicas[n] = proc
        return proc

    def _start(self, cmd: list[str], name: str, stdin=None) -> subprocess.Popen:
        proc = subprocess.Popen(
            cmd,
            stdin=stdin,
            stdout=open(self.tmp / f"{name}.out", "w"),
            stderr=open(self.tmp / f"{name}.err", "w"),
            env=self.env(),
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def records(self) -> list[dict]:
        return step_records(self.tmp)

    def wait_for(self, what, timeout_s: float, why: str):
        """Poll the records until ``what(records)`` is truthy; fail naming ``why``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = what(self.records())
            if found:
                return found
            self.check_alive()
            assert time.monotonic() < deadline, f"not within {timeout_s} s: {why}"
            time.sleep(0.1)

    def check_alive(self) -> None:
        for n, p in self.replicas.items():
            if p.poll() not in (None, 0, -signal.SIGKILL):
                raise AssertionError(
                    f"replica {n} failed ({p.returncode}):\n{self._tail(f'replica{n}.err')}"
                )

    def ready(self, count: int, timeout_s: float = 90, go: Path | None = None) -> None:
        """Wait until ``count`` replicas are ready (imported), then let them join (``go``)."""
        self.wait_for(
            lambda rs: sum(1 for r in rs if r.get("ready")) >= count,
            timeout_s,
            f"{count} replicas ready",
        )
        (go or self.go).touch()

    def finish(self, replicas: list[int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for n in replicas:
            p = self.replicas[n]
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"replica {n} did not finish within {timeout_s} s:\n{self._tail(f'replica{n}.err')}"
                ) from None
            assert p.returncode == 0, (
                f"replica {n} exited {p.returncode}:\n{self._tail(f'replica{n}.err')}"
            )

    def kill(self, n: int) -> None:
        os.killpg(self.replicas[n].pid, signal.SIGKILL)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(10)
        if self.house is not None:
            self.house.close()

    def _tail(self, name: str, lines: int = 25) -> str:
        path = self.tmp / name
        text = path.read_text() if path.exists() else ""
        keep = [line for line in text.splitlines() if "heartbeat" not in line.lower()]
        return "\n".join(keep[-lines:])


def steps_of(records: list[dict], replica: int) -> list[dict]:
    return [r for r in records if r.get("replica") == replica and "step" in r]
