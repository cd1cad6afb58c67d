"""Start workers in their namespaces: env, addresses, failure handling (needs root)."""

from __future__ import annotations

import sys
import time

import pytest
from cluster_helpers import assert_gone

from dssync.cluster import Cluster, load_cluster, parse_cluster

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]

SPEC = """
[cluster]
racks = 2
hosts_per_rack = 2
workers_per_host = 2
host_rate_mbit = 1000
rack_uplink_mbit = 500
"""

PRINT_ENV = (
    "import os, json, socket\n"
    "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'MASTER_ADDR',"
    " 'MASTER_PORT', 'GLOO_SOCKET_IFNAME', 'DSSYNC_HOST', 'DSSYNC_RACK', 'EXTRA']\n"
    "env = {k: os.environ[k] for k in keys}\n"
    "env['ifaces'] = sorted(os.listdir('/sys/class/net'))\n"
    "print(json.dumps(env))\n"
)


def test_each_worker_gets_its_env_and_namespace(tmp_path):
    spec = parse_cluster(SPEC, "launch (test)")
    with Cluster(spec) as cluster:
        result = cluster.run(
            [sys.executable, "-c", PRINT_ENV], env={"EXTRA": "1"}, timeout_s=30, log_dir=tmp_path
        )
        assert result.ok, result.summary()
        assert cluster.rank_env(5)["GLOO_SOCKET_IFNAME"] == cluster.host_ifname(2)
    import json

    envs = [json.loads((tmp_path / f"rank{r}.log").read_text()) for r in range(8)]
    for rank, env in enumerate(envs):
        host = rank // 2
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "8"
        assert env["LOCAL_RANK"] == str(rank % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == env["DSSYNC_HOST"] == str(host)
        assert env["DSSYNC_RACK"] == str(host // 2)
        assert env["MASTER_ADDR"] == "10.213.0.1" and env["EXTRA"] == "1"
        assert env["ifaces"] == sorted(["lo", env["GLOO_SOCKET_IFNAME"]])
    assert len({env["MASTER_PORT"] for env in envs}) == 1


def test_a_failing_worker_stops_the_others():
    code = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(60)\n"
    with Cluster(load_cluster("tiny")) as cluster:
        start = time.monotonic()
        result = cluster.run([sys.executable, "-c", code], timeout_s=30)
        assert time.monotonic() - start < 10
    assert result.failed_rank == 1 and result.returncodes[1] == 3
    assert result.returncodes[0] is not None and result.returncodes[0] < 0  # killed
    assert result.exit_code == 3 and "rank 1 failed with exit code 3" in result.summary()
    assert_gone(cluster.prefix)


def test_timeout_kills_everyone():
    with Cluster(load_cluster("tiny")) as cluster:
        result = cluster.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    assert result.timed_out and result.exit_code == 124
    assert all(code is not None for code in result.returncodes)


def test_workers_talk_over_gloo(tmp_path):
    code = (
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=__import__('datetime').timedelta(seconds=20))\n"
        "t = torch.tensor([float(dist.get_rank())])\n"
        "dist.all_reduce(t)\n"
        "print(t.item())\n"
        "dist.destroy_process_group()\n"
    )
    with Cluster(load_cluster("tiny")) as cluster:
        result = cluster.run([sys.executable, "-c", code], timeout_s=40, log_dir=tmp_path)
    logs = [(tmp_path / f"rank{r}.log").read_text() for r in range(2)]
    assert result.ok, (result.summary(), logs)
    assert all(log.strip().endswith("1.0") for log in logs)
