"""Ctrl-C and SIGTERM on ``dssync train`` kill every worker it started: exit 130 and 143.

(The elastic launcher's own test: ``tests/elastic/test_train_elastic.py``.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from process_tree import alive, children

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _as_at_a_terminal() -> None:
    """SIGINT as a shell gives a foreground command: a CI runner's background job ignores it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("sig", "code", "word"), [
    (signal.SIGINT, 130, "aborted"), (signal.SIGTERM, 143, "terminated"),
])  # fmt: skip
def test_a_signal_to_train_kills_its_workers_and_exits_with_its_code(tmp_path, sig, code, word):
    cmd = [
        sys.executable, "-m", "dssync", "train", "--workload", "digits", "--workers", "2", "--epochs", "400",
        "--batch-size", "8", "--quiet",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path,
        start_new_session=True, preexec_fn=_as_at_a_terminal,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while len(children(proc.pid)) < 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        time.sleep(5)  # into training (their imports take a few seconds)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        workers = children(proc.pid)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == code, err[-2000:]
    assert word in err
    time.sleep(0.5)
    assert workers and not [p for p in workers if alive(p)], "a worker outlived the run"
