"""Elastic DS-Sync on the emulated cluster, one replica per host: torchft's Lighthouse on host 0,
each replica in its host's namespace, every transfer (quorum, averaging, healing) over the
hosts' links (``run_elastic(..., hosts=Hosts.on_cluster(cluster))``).

The fault is the network's: host 2's link down for 30 s mid-run (at the switch end), then up.
Nothing is restarted: the replica cut off is left out of the quorums while its link is down and
comes back by itself once TCP gets through again. Each case is a row of docs/reliability.md.
"""

from __future__ import annotations

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

STEPS = 10_000  # about 100 s on a quiet 2-core machine; the cut-off replica rejoins before the end
TIMEOUT_S = 10.0  # each replica's transfer timeout
FAULTY_HOST = 2
FAULT_STEP = 200  # every replica past it, then the link goes down
DOWN_S = 30.0


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


def link_down_later(cluster: Cluster, folder: Path, when: dict) -> threading.Thread:
    """Once every replica passed :data:`FAULT_STEP`, host 2's link goes down for :data:`DOWN_S`
    (its switch end, as a cable pulled); ``when`` gets the times it went down and up."""
    ns, dev = cluster.link_ends(f"host:{FAULTY_HOST}")[1]

    def flap() -> None:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            path = folder / "steps.jsonl"
            if path.exists():
                past = {
                    r["replica"] for r in step_records(folder) if r.get("step", 0) >= FAULT_STEP
                }
                if len(past) == cluster.spec.num_hosts:
                    break
            time.sleep(0.1)
        else:
            return
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "down"], check=True)
        when["down"] = time.time()
        try:
            time.sleep(DOWN_S)
        finally:  # not checked: a run that failed meanwhile took the namespaces with it
            up = subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=False)
            if up.returncode == 0:
                when["up"] = time.time()

    t = threading.Thread(target=flap, daemon=True)
    t.start()
    return t


def run(folder: Path, fault: bool) -> tuple[dict, dict]:
    lines: list[str] = []
    when: dict = {}
    with Cluster(parse_cluster(FOUR_HOSTS, "elastic chaos (test)")) as cluster:
        flapper = link_down_later(cluster, folder, when) if fault else None
        folder.mkdir(parents=True)
        started = time.monotonic()
        try:
            summary = run_elastic(
                config(), cluster.spec.num_hosts, min_replicas=2, restart_delay_s=2.0,
                timeout_s=400, folder=folder, say=lines.append, hosts=Hosts.on_cluster(cluster),
            )  # fmt: skip
        finally:
            if flapper is not None:
                flapper.join(DOWN_S + 5)
    assert_gone(cluster.prefix)
    print("\n".join(lines))
    print(f"run took {time.monotonic() - started:.0f} s")
    return summary, when


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
def test_a_host_link_down_for_30_s_is_survived_without_restarting_anyone(tmp_path):
    calm, _ = run(tmp_path / "calm", fault=False)
    summary, when = run(tmp_path / "fault", fault=True)
    e = summary["elastic"]
    assert "down" in when and "up" in when, "the link never went down"
    assert e["finished"] == [0, 1, 2, 3], e["ends"]
    assert set(e["restarts"].values()) == {0}, e["restarts"]
    assert len(set(e["final_model_sha256"].values())) == 1, e["final_model_sha256"]
    steps = [r for r in step_records(tmp_path / "fault") if "step" in r]
    pids = {n: {r["pid"] for r in steps if r["replica"] == n} for n in range(4)}
    assert all(len(p) == 1 for p in pids.values()), pids  # the same process throughout
    gaps = {}
    for n in range(4):
        times = [r["time"] for r in steps if r["replica"] == n]
        gaps[n] = max(b - a for a, b in zip(times, times[1:], strict=False))
    # the survivors: the cut-off one's partner waits out its transfer, the others wait for the
    # partner at the next quorum (one timeout_s); then they go on without host 2
    survivors = [n for n in range(4) if n != FAULTY_HOST]
    assert all(gaps[n] < TIMEOUT_S + 3 for n in survivors), gaps
    without = [
        r["time"] for r in steps
        if r["replica"] != FAULTY_HOST and FAULTY_HOST not in r["members"]
        and when["down"] < r["time"] < when["up"]
    ]  # fmt: skip
    assert without, "the survivors never stepped without host 2 while its link was down"
    during = [r for r in steps if min(without) <= r["time"] < when["up"]]
    assert {r["replica"] for r in during} == set(survivors)  # they kept stepping, without it
    assert all(FAULTY_HOST not in r["members"] for r in during)
    assert when["up"] - min(without) > DOWN_S - TIMEOUT_S - 8  # for most of the outage
    last = max(r["time"] for r in steps if r["replica"] != FAULTY_HOST)
    assert last > when["up"] + 5, "the survivors ended before the link came back: raise STEPS"
    before = max(r["step"] for r in steps if r["replica"] == FAULTY_HOST and r["time"] < when["up"])
    back = [r for r in steps if r["replica"] == FAULTY_HOST and r["time"] > when["up"]]
    assert back, "host 2's replica never stepped again after its link came up"
    first = min(back, key=lambda r: r["time"])
    assert first["step"] > before + 100, (before, first)  # healed to the others' step
    rejoined = first["time"] - when["up"]
    print(f"longest gap between two steps per replica: {gaps} s; host 2's replica stepped again "
          f"{rejoined:.1f} s after its link came up, from step {before} to {first['step']}; "
          f"final metric {summary['final_metric']:.4f} (without the fault "
          f"{calm['final_metric']:.4f})")  # fmt: skip
    assert abs(summary["final_metric"] - calm["final_metric"]) <= 4 / 359 + 1e-9  # digits' test
