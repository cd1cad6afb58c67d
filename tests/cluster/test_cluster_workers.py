"""torchrun on every emulated host: placement from torchrun's env, detection, failures (root)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
from cluster_helpers import assert_gone, netns_pids

from dssync.lab.cluster import Cluster, load_cluster, parse_cluster
from dssync.lab.cluster.torchrun import entry_point
from dssync.lab.cluster.workers import root_cause

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]

# 2 racks x 1 host x 2 workers: 2 torchrun agents, 4 ranks.
SPEC = """
[cluster]
racks = 2
hosts_per_rack = 1
workers_per_host = 2
host_rate_mbit = 1000
rack_uplink_mbit = 500
"""

REPORT = """
import json, os, socket, sys, datetime
import torch.distributed as dist
from dssync.topology import detect
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
topo = detect()
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "GLOO_SOCKET_IFNAME", "DSSYNC_RACK", "EXTRA"]
out = {k: os.environ.get(k) for k in keys}
out.update(host=socket.gethostname(), ifaces=sorted(os.listdir("/sys/class/net")),
           hosts=list(topo.hosts), racks=list(topo.racks))
with open(os.path.join(sys.argv[1], f"rank{out['RANK']}.json"), "w") as f:
    json.dump(out, f)
dist.barrier()
dist.destroy_process_group()
"""


def test_torchrun_places_ranks_and_detection_agrees_with_the_spec(tmp_path):
    spec = parse_cluster(SPEC, "torchrun (test)")
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    with Cluster(spec) as cluster:
        result = cluster.run(
            [sys.executable, str(script), str(tmp_path)],
            env={"EXTRA": "1"},
            timeout_s=150,
            log_dir=tmp_path / "logs",
        )
        logs = [p.read_text()[-3000:] for p in sorted((tmp_path / "logs").glob("*.log"))]
        assert result.ok, (result.summary(), logs)
        assert [netns_pids(cluster.host_ns(h)) for h in range(2)] == [[], []]
        names = {cluster.host_ns(h): h for h in range(2)}
        ifnames = {cluster.host_ns(h): cluster.host_ifname(h) for h in range(2)}
    envs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for rank, env in enumerate(envs):
        host = names[env["host"]]  # which emulated host torchrun put this rank on
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2" and env["EXTRA"] == "1"
        assert rank == 2 * int(env["GROUP_RANK"]) + int(env["LOCAL_RANK"])
        assert env["DSSYNC_RACK"] == str(spec.rack_of_host(host))
        assert env["GLOO_SOCKET_IFNAME"] == ifnames[env["host"]]
        assert env["ifaces"] == sorted(["lo", env["GLOO_SOCKET_IFNAME"]])
        node0 = next(e for e in envs if e["GROUP_RANK"] == "0")
        assert env["MASTER_ADDR"] == node0["host"]  # the host name of node rank 0, resolved
    for host_name in names:
        on_host = [e for e in envs if e["host"] == host_name]
        assert sorted(e["LOCAL_RANK"] for e in on_host) == ["0", "1"]
        assert len({e["GROUP_RANK"] for e in on_host}) == 1
    # Detection groups the ranks exactly as torchrun placed them, racks as the spec says.
    placed = [names[e["host"]] for e in envs]
    for env in envs:
        assert env["hosts"] == envs[0]["hosts"] and env["racks"] == envs[0]["racks"]
    for a in range(4):
        for b in range(4):
            same_host = envs[0]["hosts"][a] == envs[0]["hosts"][b]
            same_rack = envs[0]["racks"][a] == envs[0]["racks"][b]
            assert same_host == (placed[a] == placed[b])
            assert same_rack == (spec.rack_of_host(placed[a]) == spec.rack_of_host(placed[b]))
    assert_gone(cluster.prefix)


def test_two_hosts_train_and_end_with_identical_parameters():
    # mnist: an MLP without BatchNorm, so DDP leaves every buffer and parameter equal.
    from dssync.lab.config import TrainConfig
    from dssync.lab.experiments.runners import ClusterRunner
    from dssync.lab.launch import core_share

    cfg = TrainConfig(
        workload="mnist", sync="bsp", epochs=1, max_steps=6, progress=False, timeout_s=60
    )
    with Cluster(parse_cluster(SPEC, "train (test)")) as cluster:
        summary = ClusterRunner(cluster, timeout_s=170).run(cfg)
    assert summary["world_size"] == 4 and summary["steps"] == 6
    # Every worker on the cluster computes with its share of the machine's cores, no more.
    assert summary["rank_threads"] == [core_share(4)] * 4
    digests = summary["worker_model_sha256"]
    assert len(digests) == 4 and len(set(digests)) == 1
    assert_gone(cluster.prefix)


def test_a_host_whose_torchrun_dies_is_named(tmp_path):
    code = (
        "import os, pathlib, sys, time\n"
        "pathlib.Path(sys.argv[1], 'up' + os.environ['RANK']).touch()\n"
        "time.sleep(120)\n"
    )
    with Cluster(load_cluster("tiny")) as cluster:
        agents = cluster.launch(
            [sys.executable, "-c", code, str(tmp_path)], log_dir=tmp_path / "logs"
        )
        try:
            end = time.monotonic() + 90
            while len(list(tmp_path.glob("up*"))) < 2 and time.monotonic() < end:
                time.sleep(0.2)
            assert len(list(tmp_path.glob("up*"))) == 2, "workers did not start"
            os.kill(agents.procs[1].pid, signal.SIGKILL)  # host 1's torchrun dies
            start = time.monotonic()
            result = agents.wait(timeout_s=60)
        finally:
            agents.kill()
        assert time.monotonic() - start < 15
        assert result.failed_host == 1 and result.returncodes[1] == -9
        assert f"host 1 ({cluster.host_ns(1)}): torchrun was killed by signal 9" in result.summary()
        assert [netns_pids(cluster.host_ns(h)) for h in range(2)] == [[], []]  # orphans too
    assert_gone(cluster.prefix)


def test_a_failing_worker_stops_every_host(tmp_path):
    code = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(120)\n"
    with Cluster(load_cluster("tiny")) as cluster:
        start = time.monotonic()
        result = cluster.run([sys.executable, "-c", code], timeout_s=120, log_dir=tmp_path)
        assert time.monotonic() - start < 60
        assert [netns_pids(cluster.host_ns(h)) for h in range(2)] == [[], []]
    assert result.failed_host in (0, 1) and result.returncodes[result.failed_host] == 1
    assert result.failed_rank == 1 and result.rank_exit_code == 3 and result.exit_code == 3
    assert "(rank 1 exited with code 3)" in result.summary()
    assert_gone(cluster.prefix)


def test_timeout_kills_every_agent_and_worker():
    with Cluster(load_cluster("tiny")) as cluster:
        result = cluster.run([sys.executable, "-c", "import time; time.sleep(120)"], timeout_s=3)
        assert [netns_pids(cluster.host_ns(h)) for h in range(2)] == [[], []]
    assert result.timed_out and result.exit_code == 124
    assert all(code is not None for code in result.returncodes)
    assert_gone(cluster.prefix)


def test_entry_point_matches_torchrun_forms():
    assert entry_point([sys.executable, "-m", "dssync", "train"]) == ["-m", "dssync", "train"]
    assert entry_point([sys.executable, "train.py", "--x"]) == ["train.py", "--x"]
    assert entry_point([sys.executable, "-c", "pass"]) == [
        "--no-python",
        sys.executable,
        "-c",
        "pass",
    ]
    assert entry_point(["true"]) == ["--no-python", "true"]


def test_root_cause_reads_torchrun_report():
    report = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-01-01_00:00:00",
        "  host      : dss01-h1",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : 7 (pid: 99)",
    ]
    assert root_cause(report) == (3, 7)
    assert root_cause(["nothing here"]) == (None, None)


def test_each_host_runs_the_documented_multi_node_command():
    from pathlib import Path

    from dssync.lab.cluster import ClusterNames, torchrun_argv

    page = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()
    command = page[page.index("torchrun --nnodes H") :].split("\n```")[0]
    line = command.replace("\\\n", " ").split(" -m ")[0]
    flags = [w for w in line.split() if w.startswith("--")]
    assert flags == [
        "--nnodes",
        "--nproc-per-node",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--rdzv-id",
    ]
    names = ClusterNames(parse_cluster(SPEC, "argv (test)"), prefix="dss01")
    argv = torchrun_argv(names, 29400, "job", [sys.executable, "-m", "dssync", "train"], 60)
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    given = dict(zip(argv[3:13:2], argv[4:14:2], strict=True))
    assert list(given) == flags
    assert given == {
        "--nnodes": "2",
        "--nproc-per-node": "2",
        "--rdzv-backend": "c10d",
        "--rdzv-endpoint": "dss01-h0:29400",
        "--rdzv-id": "job",
    }
    assert argv[-3:] == ["-m", "dssync", "train"]


def test_runs_in_one_launch_equal_fresh_ones_and_a_failed_run_is_skipped():
    # One torchrun launch makes several runs; a run that fails ends that launch, is reported as
    # failed, and a new launch makes the rest. A run repeated later in the same processes is the
    # run a fresh process made: its losses and final model are the same, bit for bit.
    from dataclasses import replace

    from dssync.lab.config import TrainConfig
    from dssync.lab.experiments.runners import ClusterRunner, RunFailed

    base = TrainConfig(
        workload="mnist", sync="bsp", epochs=1, max_steps=4, progress=False, timeout_s=60
    )
    cfgs = [
        base,
        replace(base, sync="dssync", seed=1),
        base,  # in the same processes as the first
        replace(base, workload="nosuch"),  # refused in the worker: that run fails
        replace(base, sync="dssync", seed=1),  # in a new launch
    ]
    with Cluster(load_cluster("tiny")) as cluster:
        launches = []
        launch = cluster.launch

        def counted(argv, **kwargs):
            launches.append(argv)
            return launch(argv, **kwargs)

        cluster.launch = counted
        seen = []
        ClusterRunner(cluster, timeout_s=120).run_all(cfgs, lambda i, o: seen.append((i, o)))
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    outcomes = [o for _, o in seen]
    first, other, again, failed, after = outcomes
    assert isinstance(failed, RunFailed) and "nosuch" in str(failed), str(failed)[:500]
    assert [a[-2] for a in launches] == ["--runs", "--runs"]  # before the failure, and after
    assert first["sync"] == "bsp" and other["sync"] == "dssync" and again["steps"] == 4
    assert [e["loss"] for e in again["log"]] == [e["loss"] for e in first["log"]]
    assert again["final_model_sha256"] == first["final_model_sha256"]
    assert other["final_model_sha256"] != first["final_model_sha256"]
    assert after["final_model_sha256"] == other["final_model_sha256"]
    assert_gone(cluster.prefix)
