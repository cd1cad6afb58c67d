"""A run whose output goes to a pipe (a CI log, `| tee`): progress lines on stderr, about one per
tenth of the run with rising steps, none with --quiet, and an 80-column table on stdout."""

from __future__ import annotations

import re

import pytest
from test_hostile_input import dssync

PROGRESS = re.compile(r"^(\S+) digits: step (\d+)/(\d+) \(\d+%\), epoch 1/1, loss \d+\.\d{4}, ")
RUN = ["--workload", "digits", "--workers", "2", "--epochs", "1"]


def _progress(stderr: str) -> list[tuple[str, int, int]]:
    found = [PROGRESS.match(line) for line in stderr.splitlines()]
    return [(m[1], int(m[2]), int(m[3])) for m in found if m]


@pytest.mark.timeout(300)
def test_piped_train_prints_a_line_per_tenth_and_an_80_column_table():
    r = dssync(["train", *RUN], timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = _progress(r.stderr)
    steps = [s for _, s, _ in lines]
    assert 9 <= len(lines) <= 11, r.stderr
    assert steps == sorted(set(steps)) and steps[-1] == lines[0][2]
    assert {name for name, _, _ in lines} == {"dssync"}
    assert "\r" not in r.stderr  # no bar redrawn in a log
    assert "consensus distance" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout


@pytest.mark.timeout(300)
def test_quiet_prints_no_progress():
    r = dssync(["train", *RUN, "--quiet", "--max-steps", "10"], timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _progress(r.stderr) == [] and "step" not in r.stderr


@pytest.mark.timeout(400)
def test_compare_reports_progress_of_each_run_and_that_swa_is_on(tmp_path):
    r = dssync(
        ["compare", *RUN, "--seeds", "1", "--max-steps", "20", "--out", str(tmp_path)],
        timeout=360,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    by_method = {}
    for name, step, _total in _progress(r.stderr):
        by_method.setdefault(name, []).append(step)
    assert sorted(by_method) == ["bsp", "dssync"]
    assert all(steps == list(range(2, 21, 2)) for steps in by_method.values()), by_method
    swa = [line for line in r.stdout.splitlines() if "SWA on by default" in line]
    assert len(swa) == 1 and swa[0].endswith("(--swa-start)"), r.stdout  # one unbroken line
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
