"""`dssync train --elastic`: a Lighthouse and replica processes from the command line, a lost
replica restarted after --restart-delay, exit 0 with at least --min-replicas finished.

The runs go through :func:`dssync.lab.launch.run_contained` or a Popen whose whole session is
killed at the end, so nothing they start outlives the test. The fault is the test's own: it
reads a replica's pid from the step records in --log-dir and SIGKILLs it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dssync.lab.cli import cli
from dssync.lab.elastic.launch import Lighthouse, step_records
from dssync.lab.launch import run_contained
from process_tree import alive, children

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
DIGITS = ["--workload", "digits", "--quiet"]


def train(*args: str) -> list[str]:
    return [sys.executable, "-m", "dssync", "train", "--elastic", *DIGITS, *args]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--sync", "bsp"], "--sync bsp does not run elastically; use dssync or one of"),
        (["--min-replicas", "3", "--workers", "2"], "--min-replicas 3 is more than the 2"),
        (["--overlap"], "elastic-dssync does not take --overlap"),
        (
            ["--heartbeat-ms", "500", "--lighthouse", "http://x:1"],
            "with --lighthouse URL, set heartbeat_timeout_ms where that Lighthouse is started",
        ),
    ],
)
def test_elastic_settings_that_cannot_work_are_refused_naming_the_fix(args, says):
    r = CliRunner().invoke(cli, ["train", "--elastic", *DIGITS, *args])
    assert r.exit_code != 0 and says in f"{r.output} {r.exception}", (r.output, r.exception)


@pytest.mark.parametrize("flag", [["--lighthouse", "http://x:1"], ["--heartbeat-ms", "500"]])
def test_elastic_flags_without_elastic_are_refused(flag):
    r = CliRunner().invoke(cli, ["train", *DIGITS, *flag])
    assert r.exit_code == 2 and "only apply to an elastic run: add --elastic" in r.output


@pytest.mark.parametrize(("flag", "want"), [([], 2000), (["--heartbeat-ms", "500"], 500)])
def test_heartbeat_ms_reaches_the_launcher(monkeypatch, flag, want):
    import dssync.lab.elastic.launch as launch

    seen = {}

    def fake(cfg, workers, **kw):
        seen.update(kw)
        raise launch.ElasticRunFailed("stop here")

    monkeypatch.setattr(launch, "run_elastic", fake)
    CliRunner().invoke(cli, ["train", "--elastic", *DIGITS, *flag])
    assert seen["heartbeat_ms"] == want


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("lighthouse", ["its own", "one already running"])
def test_train_elastic_runs_replicas_and_prints_the_summary(tmp_path, lighthouse):
    house = Lighthouse(tmp_path, min_replicas=2) if lighthouse != "its own" else None
    extra = ["--lighthouse", house.address] if house else []
    try:
        done = run_contained(
            train("--workers", "2", "--max-steps", "20", "--log-dir", str(tmp_path), *extra),
            200,
            env=ENV,
            cwd=ROOT,
        )
    finally:
        if house:
            house.close()
    assert done.returncode == 0, done.stderr[-3000:]
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert ("lighthouse at" in out) == (house is None), out
    assert "replica 0 started" in out and "replica 1 started" in out, out
    assert "2 of 2 replicas finished (min_replicas 2), 0 restart(s), 20 steps" in out, out
    assert "one model on every finished replica: yes" in out, out
    steps = {
        n: [r["step"] for r in step_records(tmp_path) if r["replica"] == n and "step" in r]
        for n in (0, 1)
    }
    assert steps[0] == steps[1] == list(range(1, 21))
    finals = [r for r in step_records(tmp_path) if r.get("final")]
    assert len(finals) == 2 and finals[0]["sha256"] == finals[1]["sha256"]
    assert finals[0]["members"] == [0, 1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_killed_replica_is_restarted_and_the_run_exits_0(tmp_path):
    cmd = train(
        "--workers", "3", "--min-replicas", "2", "--restart-delay", "1",
        "--epochs", "400", "--batch-size", "8", "--max-steps", "4000",
        "--log-dir", str(tmp_path),
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        while not [
            r for r in step_records(tmp_path) if r["replica"] == 2 and r.get("step", 0) >= 30
        ]:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "replica 2 did not reach step 30"
            time.sleep(0.1)
        victim = next(r["pid"] for r in step_records(tmp_path) if r["replica"] == 2)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        out, err = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
    assert proc.returncode == 0, err[-3000:]
    text = " ".join(out.split())
    assert "replica 2 lost (killed by SIGKILL); restarting in 1 s" in text, text
    assert "replica 2 restarted (start 2)" in text, text
    assert "3 of 3 replicas finished (min_replicas 2), 1 restart(s), 4000 steps" in text, text
    assert "one model on every finished replica: yes" in text, text
    rs = step_records(tmp_path)
    for n in (0, 1):  # the survivors were never restarted and kept stepping
        mine = [r for r in rs if r["replica"] == n and "step" in r]
        assert len({r["pid"] for r in mine}) == 1
        steps = [r["step"] for r in mine]
        # a replica whose manager came up after the others' first quorum (tens of ms) heals to
        # the live step when it joins the next one: seen at steps 2 and 5 of 4,000
        assert steps[0] <= 40 and steps == list(range(steps[0], 4001)), steps[:10]
        assert any(r["time"] > killed_at for r in mine)
    again = [r for r in rs if r["replica"] == 2 and "step" in r and r["pid"] != victim]
    assert again, "the restarted replica never stepped"
    assert again[0]["step"] > 31, "the restarted replica did not take the live replicas' steps"
    assert again[-1]["step"] == 4000


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_replicas_that_cannot_reach_the_lighthouse_are_not_restarted_and_the_run_exits_1():
    done = run_contained(
        train("--workers", "2", "--max-steps", "5", "--lighthouse", "http://127.0.0.1:9",
              "--timeout", "5", "--restart-delay", "0"),
        150,
        env=ENV,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    out, err = " ".join(done.stdout.split()), " ".join(done.stderr.split())
    # a replica's manager connects before the replica says it is ready: the run stops there
    assert re.search(r"error: replica [01] ended \(exit code 1\) before it started training", err)
    assert "restarted (start 2)" not in out
    assert "failed to connect to http://127.0.0.1:9" in err  # the replica's own log, shown


def wait_for_steps(folder: Path, proc: subprocess.Popen, replicas: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len({r["replica"] for r in step_records(folder) if "step" in r}) < replicas:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the replicas did not step"
        time.sleep(0.1)


def _as_at_a_terminal() -> None:
    """SIGINT as a shell gives a foreground command: a job started with ``&`` by a shell without
    job control (a CI runner) ignores SIGINT, and so would every process it starts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_kills_every_process_the_run_started(tmp_path, sig, code):
    cmd = train(
        "--workers", "2", "--epochs", "400", "--batch-size", "8", "--log-dir", str(tmp_path)
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
        start_new_session=True, preexec_fn=_as_at_a_terminal,
    )  # fmt: skip
    try:
        wait_for_steps(tmp_path, proc, 2, 150)
        pids = {r["pid"] for r in step_records(tmp_path)}
        house = int(next(iter(pid for pid in children(proc.pid) if pid not in pids)))
        proc.send_signal(sig)  # SIGINT: what Ctrl-C sends; SIGTERM: what an orchestrator sends
        _, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == code, err[-2000:]
    time.sleep(0.5)
    assert not [p for p in [*pids, house] if alive(p)], "a process outlived the run"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_run_past_its_budget_is_killed_whole(tmp_path):
    from dssync.lab.config import TrainConfig
    from dssync.lab.elastic.launch import run_elastic

    cfg = TrainConfig(workload="digits", sync="elastic-dssync", epochs=400, batch_size=8)
    cfg.progress = False
    with pytest.raises(TimeoutError, match="did not end in time; every replica was killed"):
        run_elastic(cfg, 2, timeout_s=40, folder=tmp_path, say=lambda line: None)
    pids = {r["pid"] for r in step_records(tmp_path)}
    assert pids, "the replicas never stepped within the budget"
    time.sleep(0.5)
    assert not [p for p in pids if alive(p)], "a replica outlived the run"
