"""Elastic DS-Sync on the emulated cluster, one replica per host: torchft's Lighthouse on host 0,
each replica in its host's namespace, every transfer (quorum, averaging, healing) over the
hosts' links (``run_elastic(..., hosts=Hosts.on_cluster(cluster))``).

Each fault strikes host 2's replica once every replica passed step 200: its link down for 30 s
(at the switch end), a SIGKILL with a restart 2 s later, a SIGSTOP for 20 s. The others never
restart and step on without it; it comes back healed from a live one. The run without a fault
is made once for all. Each case is a row of docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cluster_helpers import FOUR_HOSTS, assert_gone

from dssync.errors import UsageError
from dssync.lab.cluster import Cluster, parse_cluster
from dssync.lab.cluster.names import ClusterNames
from dssync.lab.config import TrainConfig
from dssync.lab.elastic.launch import Hosts, run_elastic, step_records

STEPS = 10_000  # about 100 s on a quiet 2-core machine; the faulty replica rejoins before the end
TIMEOUT_S = 10.0  # each replica's transfer timeout
FAULTY_HOST = 2
FAULT_STEP = 200  # every replica past it, then the fault
DOWN_S = 30.0  # how long host 2's link is down
STOPPED_S = 20.0  # how long host 2's replica is stopped: past TIMEOUT_S and the heartbeat (2 s)


def config() -> TrainConfig:
    cfg = TrainConfig(
        workload="digits",
        sync="elastic-dssync",
        epochs=400,
        batch_size=8,
        max_steps=STEPS,
        timeout_s=TIMEOUT_S,
        seed=0,
    )
    cfg.progress = False
    return cfg


def link_down(cluster: Cluster, folder: Path, when: dict) -> None:
    """Host 2's link down for :data:`DOWN_S` at its switch end (a cable pulled), then up."""
    ns, dev = cluster.link_ends(f"host:{FAULTY_HOST}")[1]
    subprocess.run(["ip", "-n", ns, "link", "set", dev, "down"], check=True)
    when["start"] = time.time()
    try:
        time.sleep(DOWN_S)
    finally:  # not checked: a run that failed meanwhile took the namespaces with it
        up = subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=False)
        if up.returncode == 0:
            when["end"] = time.time()


def killed(cluster: Cluster, folder: Path, when: dict) -> None:
    """Host 2's replica SIGKILLed; the launcher starts it again 2 s later (an orchestrator)."""
    os.killpg(replica_pid(folder, FAULTY_HOST), signal.SIGKILL)
    when["start"] = when["end"] = time.time()


def stopped(cluster: Cluster, folder: Path, when: dict) -> None:
    """Host 2's replica SIGSTOPped for :data:`STOPPED_S`, then resumed."""
    pid = replica_pid(folder, FAULTY_HOST)
    os.killpg(pid, signal.SIGSTOP)
    when["start"] = time.time()
    try:
        time.sleep(STOPPED_S)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a run that failed meanwhile killed it
            os.killpg(pid, signal.SIGCONT)
            when["end"] = time.time()


def replica_pid(folder: Path, replica: int) -> int:
    """The process that wrote replica ``replica``'s last step record: the launcher's process
    and its session's leader (``ip netns exec`` execs the replica in place)."""
    return [r["pid"] for r in step_records(folder) if r["replica"] == replica][-1]


def fault_later(cluster: Cluster, folder: Path, when: dict, fault) -> threading.Thread:
    """Once every replica passed :data:`FAULT_STEP`, ``fault(cluster, folder, when)``, which
    records in ``when`` the times the fault started and ended."""

    def wait_then_fault() -> None:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            past = {r["replica"] for r in step_records(folder) if r.get("step", 0) >= FAULT_STEP}
            if len(past) == cluster.spec.num_hosts:
                fault(cluster, folder, when)
                return
            time.sleep(0.1)

    t = threading.Thread(target=wait_then_fault, daemon=True)
    t.start()
    return t


def run(folder: Path, fault=None) -> tuple[dict, dict]:
    lines: list[str] = []
    when: dict = {}
    with Cluster(parse_cluster(FOUR_HOSTS, "elastic chaos (test)")) as cluster:
        folder.mkdir(parents=True)
        thread = fault_later(cluster, folder, when, fault) if fault is not None else None
        started = time.monotonic()
        try:
            summary = run_elastic(
                config(), cluster.spec.num_hosts, min_replicas=2, restart_delay_s=2.0,
                timeout_s=400, folder=folder, say=lines.append, hosts=Hosts.on_cluster(cluster),
            )  # fmt: skip
        finally:
            if thread is not None:
                thread.join(DOWN_S + 5)
    assert_gone(cluster.prefix)
    print("\n".join(lines))
    print(f"run took {time.monotonic() - started:.0f} s")
    return summary, when


@pytest.fixture(scope="module")
def calm(tmp_path_factory) -> dict:
    """The run without a fault, once for the module's fault tests."""
    return run(tmp_path_factory.mktemp("calm") / "run")[0]


def test_hosts_place_one_replica_per_host_of_a_cluster_in_its_namespace():
    names = ClusterNames(parse_cluster(FOUR_HOSTS, "placement (test)"), "dss91")
    hosts = Hosts.on_cluster(names)
    assert hosts.prefix[2] == ["ip", "netns", "exec", "dss91-h2"]
    assert hosts.env[2] == {"GLOO_SOCKET_IFNAME": "dss91h2"}
    assert hosts.address == ["10.213.0.1", "10.213.0.2", "10.213.0.3", "10.213.0.4"]
    assert [hosts.of(n) for n in range(6)] == [0, 1, 2, 3, 0, 1]
    assert Hosts().address == ["127.0.0.1"] and Hosts().of(5) == 0  # this machine alone
    with pytest.raises(UsageError, match="one prefix, env and address per host"):
        Hosts(prefix=[[], []], env=[{}], address=["10.0.0.1"])


def test_a_replica_of_a_run_over_machines_gives_its_own_address(monkeypatch):
    monkeypatch.setenv("DSSYNC_REPLICA_HOST", "10.1.2.3")  # `--lighthouse URL` on each machine
    assert Hosts().address == ["10.1.2.3"]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(900, method="signal")
def test_a_host_link_down_for_30_s_is_survived_without_restarting_anyone(tmp_path, calm):
    """The replica cut off is left out of the quorums while its link is down and comes back by
    itself once TCP gets through again: healed from a live one, no process restarted."""
    folder = tmp_path / "run"
    survived(calm, *run(folder, link_down), folder, "link down 30 s", restarted=False)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(900, method="signal")
def test_a_replica_killed_and_restarted_on_its_host_is_healed_and_the_others_never_stop(
    tmp_path, calm
):
    folder = tmp_path / "run"
    survived(calm, *run(folder, killed), folder, "SIGKILL, restart 2 s", restarted=True)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(900, method="signal")
def test_a_replica_stopped_past_the_timeout_on_its_host_rejoins_and_the_others_never_stop(
    tmp_path, calm
):
    folder = tmp_path / "run"
    survived(calm, *run(folder, stopped), folder, "SIGSTOP 20 s", restarted=False)


def survived(calm: dict, summary: dict, when: dict, folder: Path, fault: str, restarted: bool):
    """What every fault on host 2's replica must leave: all four finished on one model within 4
    test images of the calm run; the survivors never restarted, never stalled past one
    ``timeout_s`` + 3 s and stepped on without host 2 until it rejoined; host 2's replica healed
    to the others' step (restarted under its number when ``restarted``), and no step of its
    that began after the fault averaged before the heal."""
    e = summary["elastic"]
    assert "start" in when and "end" in when, f"the fault ({fault}) never happened: {when}"
    assert e["finished"] == [0, 1, 2, 3], e["ends"]
    assert e["restarts"] == {"0": 0, "1": 0, "2": int(restarted), "3": 0}, e["restarts"]
    assert len(set(e["final_model_sha256"].values())) == 1, e["final_model_sha256"]
    steps = [r for r in step_records(folder) if "step" in r]
    pids = {n: {r["pid"] for r in steps if r["replica"] == n} for n in range(4)}
    assert [len(pids[n]) for n in range(4)] == [1, 1, 1 + restarted, 1], pids
    survivors = [n for n in range(4) if n != FAULTY_HOST]
    gaps = {}
    for n in survivors:
        times = [r["time"] for r in steps if r["replica"] == n]
        gaps[n] = max(b - a for a, b in zip(times, times[1:], strict=False))
    # a fault inside an averaging: the partner waits out its transfer (timeout_s) and the others
    # wait for the partner at the next quorum; a kill, or a fault between two averagings: they
    # wait at the next quorum for the Lighthouse's heartbeat timeout. Then they go on without it.
    assert all(gaps[n] < TIMEOUT_S + 3 for n in survivors), gaps
    mine = [r for r in steps if r["replica"] == FAULTY_HOST]
    before = max(r["step"] for r in mine if r["time"] < when["start"])
    back = [r for r in mine if r["time"] > when["end"]]
    assert back, "host 2's replica never stepped again after the fault"
    healed = next((r for r in back if r["healed"]), None)
    assert healed is not None, "host 2's replica was never healed after the fault"
    assert healed["step"] > before + 100, (before, healed)  # to the others' step
    # Its first step after the fault need not be the healed one: the step the fault interrupted
    # ends first, on the quorum of before the fault. Seen: after the link came up (here in its
    # log; in CI the same steps, 202 then 203 not healed) the Lighthouse's quorum answer sent as
    # the link went down came 53 s later, after TCP's back-off, and that step waited out its gone
    # partner (lost); after a SIGSTOP that struck once its exchange was done, the step recorded
    # "averaged" on resuming (its partner had stepped on at once). No later step may average
    # before the heal: its stale model goes into no one.
    stale = [r for r in back if r["time"] < healed["time"]]
    assert [r["step"] for r in stale[:1]] in ([], [before + 1]), (before, stale)
    assert all(r["outcome"] in ("lost", "skipped", "alone") for r in stale[1:]), stale
    if restarted:
        assert not stale, stale  # a new process's first step is its heal
    out = [
        r["time"] for r in steps
        if r["replica"] in survivors and FAULTY_HOST not in r["members"] and r["time"] > when["start"]
    ]  # fmt: skip
    assert out, "the survivors never stepped without host 2 after the fault"
    rejoined = min(
        r["time"] for r in steps
        if r["replica"] in survivors and r["time"] > min(out) and FAULTY_HOST in r["members"]
    )  # fmt: skip
    assert rejoined >= when["end"], "host 2 was back in the survivors' quorums during the fault"
    during = [r for r in steps if min(out) <= r["time"] < min(rejoined, back[0]["time"])]
    assert {r["replica"] for r in during} == set(survivors)  # all kept stepping, without it
    assert all(FAULTY_HOST not in r["members"] for r in during)
    assert when["end"] - min(out) > (when["end"] - when["start"]) - TIMEOUT_S - 8  # most of it
    last = max(r["time"] for r in steps if r["replica"] in survivors)
    assert last > healed["time"] + 5, "the survivors ended before host 2 came back: raise STEPS"
    print(f"{fault}: longest gap between two steps per survivor {gaps} s; without host 2 for "
          f"{rejoined - min(out):.1f} s; host 2's replica healed {healed['time'] - when['end']:.1f}"
          f" s after the fault ended ({len(stale)} steps on its own before), from step {before} "
          f"to {healed['step']}; final metric {summary['final_metric']:.4f} (without the fault "
          f"{calm['final_metric']:.4f})")  # fmt: skip
    assert abs(summary["final_metric"] - calm["final_metric"]) <= 4 / 359 + 1e-9  # digits' test
