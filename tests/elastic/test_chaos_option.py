"""The launcher's punisher (``Chaos``) on stand-in processes: when it kills, whom, and whom never.

The replicas here are ``sleep`` processes in sessions of their own (as the launcher starts
replicas) with step records written by the test; every one is killed at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from dssync.errors import UsageError
from dssync.lab.elastic.launch import Chaos, Replica, _punish, _stepped


@pytest.fixture
def team(tmp_path):
    team = [Replica(n, subprocess.Popen(["sleep", "60"], start_new_session=True)) for n in range(3)]
    try:
        yield team
    finally:
        for r in team:
            try:
                os.killpg(r.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            r.proc.wait(10)


def stepped(folder, *replicas: Replica) -> None:
    with open(folder / "steps.jsonl", "a") as f:
        for r in replicas:
            f.write(json.dumps({"pid": r.proc.pid, "replica": r.number, "step": 1}) + "\n")


def test_gaps_are_every_s_give_or_take_spread_and_the_seed_repeats_them():
    a, b = Chaos(every_s=25, seed=3), Chaos(every_s=25, seed=3)
    gaps = [a.gap() for _ in range(200)]
    assert all(20 <= g <= 30 for g in gaps) and max(gaps) - min(gaps) > 5
    assert gaps == [b.gap() for _ in range(200)]


@pytest.mark.parametrize(
    "kw, says", [({"every_s": 0}, "every_s=0 must be > 0"), ({"every_s": 5, "spread": 1}, "spread")]
)
def test_bad_settings_are_refused(kw, says):
    with pytest.raises(UsageError, match=says):
        Chaos(**kw)


def test_it_waits_for_every_replica_to_step_then_kills_one_that_stepped(tmp_path, team):
    chaos, said = Chaos(every_s=1, seed=0), []
    stepped(tmp_path, team[0], team[1])
    _punish(team, tmp_path, chaos, 1, time.monotonic(), said.append)
    assert chaos.next_at is None, "the clock started before every replica had stepped"
    stepped(tmp_path, team[2])
    now = time.monotonic()
    _punish(team, tmp_path, chaos, 1, now, said.append)
    assert chaos.next_at is not None and 0.8 <= chaos.next_at - now <= 1.2
    _punish(team, tmp_path, chaos, 1, now + 0.5, said.append)
    assert chaos.kills == [], "killed before its time"
    _punish(team, tmp_path, chaos, 1, now + 2, said.append)
    (kill,) = chaos.kills
    victim = team[kill["replica"]]
    assert victim.proc.wait(10) == -signal.SIGKILL and kill["pid"] == victim.proc.pid
    assert said == [
        f"chaos: killed replica {victim.number} (pid {victim.proc.pid}); next kill in 1 s"
    ]
    # a restarted process that has not stepped is never the victim
    victim.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    for _ in range(10):
        _punish(team, tmp_path, chaos, 0, chaos.next_at + 0.1, said.append)
    assert victim.proc.poll() is None, "a replica that had not stepped was killed"


def test_it_never_leaves_fewer_than_min_replicas_running_nor_kills_once_one_finished(
    tmp_path, team
):
    chaos = Chaos(every_s=1, seed=0)
    stepped(tmp_path, *team)
    now = time.monotonic()
    _punish(team, tmp_path, chaos, 3, now, lambda line: None)
    _punish(team, tmp_path, chaos, 3, now + 5, lambda line: None)
    assert chaos.kills == [], "a kill left fewer than min_replicas running"
    team[0].ends.append("finished")
    _punish(team, tmp_path, chaos, 1, now + 5, lambda line: None)
    assert chaos.kills == [], "a kill after a replica had finished"


def test_stepped_reads_only_what_was_added_and_waits_for_a_whole_line(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text('{"pid": 7, "replica": 0, "ready": true}\n{"pid": 7, "replica": 0, "eval_')
    assert not _stepped(tmp_path, 7)  # no step yet; the half line is not read
    with path.open("a") as f:
        f.write('step": 1}\n{"pid": 8, "replica": 1, "step": 1}\n{"pid": 9, "replica": 2, "st')
    assert _stepped(tmp_path, 8) and not _stepped(tmp_path, 7) and not _stepped(tmp_path, 9)
    with path.open("a") as f:
        f.write('ep": 4}\n')
    assert _stepped(tmp_path, 9) and _stepped(tmp_path, 8)
    path.write_text('{"pid": 5, "replica": 0, "step": 1}\n')  # a shorter file in its place
    assert _stepped(tmp_path, 5) and not _stepped(tmp_path, 8)
