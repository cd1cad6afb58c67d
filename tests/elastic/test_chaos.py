"""A Lighthouse and replicas as processes, on loopback: training, a replica lost, one joining.

Each test starts its processes and kills every one of them at the end (the ``cluster``
fixture), and each process ends by its own deadline besides.
"""

from __future__ import annotations

import time

import pytest
from cluster import steps_of

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
        assert all(r["members"] == [0, 1, 2] for r in steps)
        # pairs and one alone: each replica averaged in most of its 15 steps
        assert sum(r["outcome"] == "averaged" for r in steps) >= 5, steps


def test_a_killed_replica_costs_only_its_group_and_the_others_finish(cluster):
    cluster.lighthouse(min_replicas=2)
    for n in range(3):
        cluster.replica(n, 80, "--final", "--step-s=0.05")
    cluster.ready(3)
    cluster.wait_for(
        lambda rs: all(len(steps_of(rs, n)) >= 15 for n in range(3)), 60, "15 steps on each"
    )
    cluster.kill(2)
    killed_at = time.time()
    at_kill = {n: len(steps_of(cluster.records(), n)) for n in (0, 1)}
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
        print(f"replica {n}: longest gap between steps {gap:.2f} s (timeout_s={TIMEOUT_S})")
        # a lost partner is seen by its closed connection, a lost member of the quorum by its
        # heartbeat (2 s): far under the transfer timeout
        assert gap < TIMEOUT_S, f"replica {n} waited {gap:.1f} s between two steps"
    finals = {r["replica"]: r for r in records if "final" in r}
    assert sorted(finals) == [0, 1]
    assert finals[0]["final"] == finals[1]["final"]
    assert finals[0]["members"] == [0, 1]


def test_a_joining_replica_gets_the_live_state_and_averages_from_the_next_step(cluster):
    cluster.lighthouse(min_replicas=2)
    for n in range(3):
        cluster.replica(n, 60, "--final", "--step-s=0.05")
    cluster.ready(3)
    cluster.wait_for(lambda rs: len(steps_of(rs, 0)) >= 10, 60, "10 steps on replica 0")
    cluster.replica(3, 60, "--final", "--step-s=0.05", go=False)
    healed = cluster.wait_for(
        lambda rs: [r for r in rs if r.get("replica") == 3 and "healed_from" in r],
        90,
        "replica 3 healed",
    )[0]
    source = healed["healed_from"]
    assert source["replica"] in (0, 1, 2)
    assert healed["holds"] == source["params"], "the joiner's parameters are not its source's"
    assert healed["steps_after"] == source["steps"] > 10
    cluster.finish([0, 1, 2, 3], timeout_s=120)
    records = cluster.records()
    first = steps_of(records, 3)[0]
    assert first["healed"] and first["members"] == [0, 1, 2, 3]
    assert first["outcome"] == "averaged" and len(first["group"]) == 2
    finals = {r["replica"]: r["final"] for r in records if "final" in r}
    assert sorted(finals) == [0, 1, 2, 3]
    assert finals[0] == finals[1] == finals[2] == finals[3]
