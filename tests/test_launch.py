"""The multi-process helper: results by rank, forwarded exceptions, kill on timeout."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from dssync.lab.launch import WorkerError, spawn


def _rank_and_pid():
    return dist.get_rank(), dist.get_world_size(), os.getpid()


def test_results_come_back_by_rank():
    out = spawn(_rank_and_pid, 3, timeout_s=60)
    assert [r[:2] for r in out] == [(0, 3), (1, 3), (2, 3)]
    assert len({r[2] for r in out}) == 3


def _raises_on_rank_one():
    if dist.get_rank() == 1:
        raise KeyError("no such shard")
    dist.barrier()


def test_exception_is_forwarded_with_traceback():
    with pytest.raises(WorkerError) as info:
        spawn(_raises_on_rank_one, 2, timeout_s=60, collective_timeout_s=10)
    assert info.value.rank == 1 and info.value.exc_type == "KeyError"
    assert "Traceback" in info.value.detail and "no such shard" in info.value.detail


def _sleeps_forever(pid_dir: str):
    with open(os.path.join(pid_dir, str(dist.get_rank())), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)


def test_timeout_kills_every_rank(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="timed out"):
        spawn(_sleeps_forever, 2, args=(str(tmp_path),), timeout_s=8)
    assert time.monotonic() - t0 < 30
    for f in tmp_path.iterdir():
        pid = int(f.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_on_one_machine_share_its_cores_and_get_at_least_one_thread():
    from dssync.lab.cluster.names import ClusterNames
    from dssync.lab.cluster.spec import ClusterSpec
    from dssync.lab.cluster.torchrun import host_env
    from dssync.lab.launch import core_share

    assert core_share(8, cores=2) == 1 and core_share(2, cores=16) == 8
    assert core_share(3, cores=16) == 5 and core_share(0, cores=4) == 4
    spec = ClusterSpec("t", racks=2, hosts_per_rack=2, workers_per_host=2, host_rate_mbit=1000)
    env = host_env(ClusterNames(spec, "dss01"), 1)
    assert env["OMP_NUM_THREADS"] == str(core_share(spec.world_size))


def _threads() -> int:
    return torch.get_num_threads()


def test_spawned_workers_compute_with_their_share_of_the_cores():
    from dssync.lab.launch import core_share

    assert spawn(_threads, 2, timeout_s=60) == [core_share(2)] * 2


TORCHRUN_SLEEPER = """
import os, sys, time
open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}"), "w").write(str(os.getpid()))
while True:
    time.sleep(1)
"""


@pytest.mark.timeout(60)  # before: the ranks held the pipes open and the wait for them hung
def test_a_contained_torchrun_past_its_timeout_leaves_no_rank_alive(tmp_path):
    """torchrun starts each rank in a session of its own: killing the agent's group misses them."""
    import sys

    from dssync.lab.launch import free_port, run_contained
    from process_tree import alive

    script = tmp_path / "sleeper.py"
    script.write_text(TORCHRUN_SLEEPER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--master-port", str(free_port()),
           "--nproc-per-node", "2", str(script), str(tmp_path)]  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish"):
        run_contained(cmd, 12)
    assert time.monotonic() - t0 < 40  # no wait on pipes the ranks still held
    pids = [int(f.read_text()) for f in tmp_path.glob("rank*")]
    assert len(pids) == 2, "the ranks did not start within the timeout"
    time.sleep(0.5)
    assert not [p for p in pids if alive(p)], "a rank outlived run_contained"
