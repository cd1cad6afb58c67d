"""A Lighthouse and replicas as processes, on loopback: training, a replica lost, one joining.

Each test starts its processes and kills every one of them at the end (the ``cluster``
fixture), and each process ends by its own deadline besides.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from local_replicas import steps_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(200)]

TIMEOUT_S = 20.0  # each replica's transfer timeout (--timeout-s default)


def test_replicas_train_and_end_identical(cluster):
    cluster.lighthouse(min_replicas=3)
    for n in range(3):
        cluster.replica(n, 15, "--final")
    cluster.ready(3)
    cluster.finish([0, 1, 2], timeout_s=90)
    records = cluster.records()
    finals = {r["replica"]: r for r in records if "final" in r}
    assert sorted(finals) == [0, 1, 2]
    assert {tuple(r["members"]) for r in finals.values()} == {(0, 1, 2)}
    assert finals[0]["final"] == finals[1]["final"] == finals[2]["final"]
    for n in range(3):
        steps = steps_of(records, n)
        assert [r["step"] for r in steps] == list(range(1, 16))
        assert all(r["members"] == [0, 1, 2] for r in steps), [
            (r["step"], r["members"], r["outcome"]) for r in steps
        ]
        # pairs and one alone: each replica averaged in most of its 15 steps
        assert sum(r["outcome"] == "averaged" for r in steps) >= 5, steps


@pytest.mark.parametrize("when", ["between averagings", "inside an averaging"])
def test_a_killed_replica_costs_only_its_group_and_the_others_finish(cluster, when):
    cluster.lighthouse(min_replicas=2)
    dies = ["--die-in-averaging=15"] if when == "inside an averaging" else []
    for n in range(3):
        cluster.replica(n, 80, "--final", "--step-s=0.05", *(dies if n == 2 else []))
    cluster.ready(3)
    if dies:
        cluster.wait_for(lambda rs: cluster.replicas[2].poll() is not None, 90, "replica 2 died")
    else:
        cluster.wait_for(
            lambda rs: all(len(steps_of(rs, n)) >= 15 for n in range(3)), 90, "15 steps on each"
        )
        cluster.kill(2)
    killed_at = time.time()
    at_kill = {n: len(steps_of(cluster.records(), n)) for n in (0, 1)}
    assert all(k < 70 for k in at_kill.values()), f"the run was nearly over at the kill: {at_kill}"
    cluster.finish([0, 1], timeout_s=120)
    records = cluster.records()
    for n in (0, 1):
        steps = steps_of(records, n)
        assert len({r["pid"] for r in steps}) == 1, "a survivor was restarted"
        assert [r["step"] for r in steps] == list(range(1, 81))
        after = [r for r in steps if r["time"] > killed_at]
        assert len(after) >= 80 - at_kill[n] - 1, "the survivor stopped stepping"
        assert after[-1]["members"] == [0, 1], "the last quorums still hold the killed replica"
        times = [r["time"] for r in steps]
        gap = max(b - a for a, b in zip(times, times[1:], strict=False))
        print(
            f"{when}: replica {n}'s longest gap between steps {gap:.2f} s (timeout_s={TIMEOUT_S})"
        )
        # a partner lost in the exchange is seen by its closed connection, a member lost between
        # averagings by its missing heartbeat (2 s here): both well under the transfer timeout
        assert gap < TIMEOUT_S, f"replica {n} waited {gap:.1f} s between two steps"
    if dies:  # only the dead one's group missed that averaging; its partner named it
        lost = [r for n in (0, 1) for r in steps_of(records, n) if r["outcome"] == "lost"]
        assert len(lost) == 1 and list(lost[0]["lost"]) == ["2"], lost
        assert lost[0]["group"] == sorted([lost[0]["replica"], 2])
        other = 1 - lost[0]["replica"]
        same = [r for r in steps_of(records, other) if r["averaging"] == lost[0]["averaging"]]
        assert same and same[0]["outcome"] == "alone", same
    finals = {r["replica"]: r for r in records if "final" in r}
    assert sorted(finals) == [0, 1]
    assert finals[0]["final"] == finals[1]["final"]
    assert finals[0]["members"] == [0, 1]


JOIN_S = 30.0  # a joiner (imported already) averages within this long of being let in


def test_a_joining_replica_gets_the_live_state_and_averages_from_the_next_step(cluster):
    """A new replica joins at step 50 with no failure: healed from a live one, it averages at
    its first step; the others never stop."""
    cluster.lighthouse(min_replicas=2)
    for n in range(3):
        cluster.replica(n, 150, "--final", "--step-s=0.05")
    joiner_go = cluster.tmp / "go3"
    cluster.replica(3, 150, "--final", "--step-s=0.05", go=joiner_go)
    cluster.ready(4)  # all imported; 0-2 start, replica 3 waits
    cluster.wait_for(lambda rs: len(steps_of(rs, 0)) >= 50, 90, "50 steps on replica 0")
    joiner_go.touch()
    let_in = time.time()
    healed = cluster.wait_for(
        lambda rs: [r for r in rs if r.get("replica") == 3 and "healed_from" in r],
        90,
        "replica 3 healed",
    )[0]
    source = healed["healed_from"]
    assert source["replica"] in (0, 1, 2)
    assert healed["holds"] == source["params"], "the joiner's parameters are not its source's"
    assert healed["steps_after"] == source["steps"] >= 50
    cluster.finish([0, 1, 2, 3], timeout_s=120)
    records = cluster.records()
    first = steps_of(records, 3)[0]
    assert first["healed"] and first["members"] == [0, 1, 2, 3]
    assert first["outcome"] == "averaged" and len(first["group"]) == 2
    waited = first["time"] - let_in
    print(f"the joiner's first averaging {waited:.2f} s after it was let in (bound {JOIN_S} s)")
    assert waited < JOIN_S
    for n in range(3):
        assert len({r["pid"] for r in steps_of(records, n)}) == 1, "a replica was restarted"
        gap = longest_gap(steps_of(records, n))
        print(
            f"joining: replica {n}'s longest gap between steps {gap:.2f} s (timeout_s={TIMEOUT_S})"
        )
        assert gap < TIMEOUT_S
    finals = {r["replica"]: r["final"] for r in records if "final" in r}
    assert sorted(finals) == [0, 1, 2, 3]
    assert finals[0] == finals[1] == finals[2] == finals[3]


def longest_gap(steps: list[dict], since: float = 0.0, until: float = float("inf")) -> float:
    """The longest time between two consecutive steps that end in [since, until]."""
    times = [r["time"] for r in steps]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if since <= b and a <= until]
    return max(gaps, default=0.0)


def test_a_killed_replica_restarted_after_a_delay_is_healed_and_the_others_never_stop(cluster):
    """SIGKILL, then a new process for that replica 2 s later (an orchestrator's restart)."""
    cluster.lighthouse(min_replicas=2)
    for n in range(3):
        cluster.replica(n, 300, "--final", "--step-s=0.05")
    cluster.ready(3)
    cluster.wait_for(lambda rs: len(steps_of(rs, 2)) >= 20, 90, "20 steps on replica 2")
    victim = cluster.replicas[2].pid
    cluster.kill(2)
    killed_at = time.time()
    time.sleep(2.0)
    started = time.time()
    cluster.replica(2, 300, "--final", "--step-s=0.05")  # ``go`` exists: it joins at once
    cluster.finish([0, 1, 2], timeout_s=180)
    records = cluster.records()
    again = [r for r in steps_of(records, 2) if r["pid"] != victim]
    assert again and again[0]["healed"], "the restarted replica was not healed from a live one"
    assert again[0]["step"] > 20 and again[-1]["step"] == 300
    print(f"restarted replica's first averaging {again[0]['time'] - started:.2f} s after its start")
    for n in (0, 1):
        steps = steps_of(records, n)
        assert len({r["pid"] for r in steps}) == 1, "a survivor was restarted"
        assert [r["step"] for r in steps] == list(range(1, 301))
        gap = longest_gap(steps, since=killed_at)
        print(f"kill and restart: replica {n}'s longest gap {gap:.2f} s (timeout_s={TIMEOUT_S})")
        assert gap < TIMEOUT_S
    finals = {r["replica"]: r for r in records if "final" in r}
    assert sorted(finals) == [0, 1, 2]
    assert finals[0]["final"] == finals[1]["final"] == finals[2]["final"]
    assert finals[0]["members"] == [0, 1, 2]


STOP_TIMEOUT_S = 5.0  # the replicas' timeout_s in the SIGSTOP test
STOPPED_S = 8.0  # how long replica 2 is stopped: past STOP_TIMEOUT_S and the heartbeat (2 s)


def test_a_replica_stopped_past_the_timeout_then_resumed_rejoins_and_the_others_never_stop(
    cluster,
):
    cluster.lighthouse(min_replicas=2)
    for n in range(3):
        cluster.replica(n, 300, "--final", "--step-s=0.05", f"--timeout-s={STOP_TIMEOUT_S}")
    cluster.ready(3)
    cluster.wait_for(lambda rs: len(steps_of(rs, 2)) >= 20, 90, "20 steps on replica 2")
    os.killpg(cluster.replicas[2].pid, signal.SIGSTOP)
    stopped_at = time.time()
    time.sleep(STOPPED_S)
    os.killpg(cluster.replicas[2].pid, signal.SIGCONT)
    resumed_at = time.time()
    cluster.finish([0, 1, 2], timeout_s=180)
    records = cluster.records()
    for n in (0, 1, 2):
        assert len({r["pid"] for r in steps_of(records, n)}) == 1, f"replica {n} was restarted"
    for n in (0, 1):
        steps = steps_of(records, n)
        during = [r for r in steps if stopped_at < r["time"] < resumed_at]
        gap = longest_gap(steps, since=stopped_at)
        print(
            f"SIGSTOP {STOPPED_S} s: replica {n} made {len(during)} steps while replica 2 was "
            f"stopped; longest gap {gap:.2f} s (timeout_s={STOP_TIMEOUT_S})"
        )
        assert during, f"replica {n} stopped while replica 2 was stopped"
        assert gap < STOP_TIMEOUT_S + 3.0  # a partner in flight waits timeout_s, then a quorum
        assert [r["step"] for r in steps] == list(range(1, 301))
    back = [r for r in steps_of(records, 2) if r["time"] > resumed_at]
    assert any(r["outcome"] == "averaged" for r in back), "replica 2 never averaged again"
    finals = {r["replica"]: r for r in records if "final" in r}
    assert sorted(finals) == [0, 1, 2]
    assert finals[0]["final"] == finals[1]["final"] == finals[2]["final"]


def test_the_survivors_stall_after_a_loss_is_the_lighthouses_heartbeat_timeout(tmp_path):
    """The survivors' stall after a loss between averagings: torchft's Lighthouse keeps
    waiting at the next quorum for a member of the last one until its heartbeat is
    ``heartbeat_timeout_ms`` old (replicas beat every 100 ms, torchft's Manager default). A
    shorter timeout shortens the stall by as much."""
    from local_replicas import Cluster

    gaps = {}
    for heartbeat_ms in (2000, 500):
        c = Cluster(tmp_path / str(heartbeat_ms), heartbeat_ms=heartbeat_ms)
        c.tmp.mkdir()
        try:
            c.lighthouse(min_replicas=2)
            for n in range(3):
                c.replica(n, 200, "--step-s=0.05")
            c.ready(3)
            c.wait_for(lambda rs: len(steps_of(rs, 2)) >= 20, 90, "20 steps on replica 2")  # noqa: B023
            c.kill(2)
            c.finish([0, 1], timeout_s=120)
            records = c.records()
        finally:
            c.close()
        gaps[heartbeat_ms] = max(gap_at_loss(steps_of(records, n), [0, 1]) for n in (0, 1))
        print(
            f"heartbeat_timeout_ms={heartbeat_ms}: the survivors' gap at their first step "
            f"without replica 2 {gaps[heartbeat_ms]:.2f} s"
        )
    assert 1.8 < gaps[2000] < 4.0, gaps
    assert gaps[500] < 1.2, gaps
    assert gaps[2000] - gaps[500] > 1.0, gaps


def gap_at_loss(steps: list[dict], members: list[int]) -> float:
    """The time between a replica's last step with the lost member and its first without."""
    i = next(i for i, r in enumerate(steps) if r["members"] == members and i > 0)
    return steps[i]["time"] - steps[i - 1]["time"]
