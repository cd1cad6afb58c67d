"""The nccl_like test backend keeps NCCL's rules: each rule has a check that fails without it.

One spawn runs the rule cases on 3 ranks (starting workers is the slow part); the watchdog, which
ends its process, has a spawn of its own.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import dssync
from dssync.lab.launch import WorkerError, spawn


def _first_op_must_be_a_collective() -> None:
    from dssync.testing import RuleBroken

    peer = 1 - dist.get_rank() if dist.get_rank() < 2 else 0
    with pytest.raises(RuleBroken, match="first operation on this process group"):
        dist.isend(torch.ones(1), peer)
    dist.all_reduce(torch.ones(1))  # from here on, point-to-point is allowed


def _wait_ignores_its_timeout() -> None:
    """Rank 1 sends 1.5 s late; rank 0's wait(timeout=0.2 s) returns only once it came (gloo's
    would raise at 0.2 s)."""
    if dist.get_rank() == 0:
        got = torch.zeros(1)
        work = dist.irecv(got, 1)
        t0 = time.monotonic()
        assert work.wait(timeout=timedelta(seconds=0.2)) is True
        assert time.monotonic() - t0 > 1.2 and got.item() == 7.0
    elif dist.get_rank() == 1:
        time.sleep(1.5)
        dist.send(torch.full((1,), 7.0), 0)


def _tags_are_ignored() -> None:
    """Sent with tags 1 then 2, received asking for tag 2 first: NCCL matches by order (gloo by
    tag would swap them)."""
    if dist.get_rank() == 0:
        dist.send(torch.full((1,), 1.0), 1, tag=1)
        dist.send(torch.full((1,), 2.0), 1, tag=2)
    elif dist.get_rank() == 1:
        first, second = torch.zeros(1), torch.zeros(1)
        works = [dist.irecv(first, 0, tag=2), dist.irecv(second, 0, tag=1)]
        for w in works:
            w.wait()
        assert (first.item(), second.item()) == (1.0, 2.0)


def _peers_are_counted() -> None:
    from dssync.testing import forget_peers, peers

    forget_peers()
    rank = dist.get_rank()
    partners = [1, 2] if rank == 0 else [0]
    for p in partners:
        ops = [
            dist.P2POp(dist.irecv, torch.zeros(1), p),
            dist.P2POp(dist.isend, torch.ones(1), p),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    assert peers() == set(partners), peers()


def _abort_fails_pending_and_later_operations() -> None:
    """A group aborted by rank 0 while its receive is pending: the wait raises Aborted (not a
    watchdog exit, although the group's 1 s timeout passes), and so does a later operation."""
    from dssync.testing import Aborted

    side = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1), group=side)
        work = dist.irecv(torch.zeros(1), 1, group=side)
        side.abort()
        assert work.is_completed()
        with pytest.raises(Aborted):
            work.wait()
        with pytest.raises(Aborted):
            dist.all_reduce(torch.ones(1), group=side)
        time.sleep(1.5)  # past the group's timeout: the watchdog leaves an aborted group alone
    elif dist.get_rank() == 1:
        dist.all_reduce(torch.ones(1), group=side)
    dist.barrier()
    if dist.get_rank() == 1:  # lets rank 0's pending receive end underneath
        dist.send(torch.ones(1), 0, group=side)


def _rules() -> list[str]:
    from dssync.testing import use_nccl_like_world

    use_nccl_like_world(timeout_s=30)
    assert dist.get_backend() == "nccl_like"
    passed = []
    for case in (
        _first_op_must_be_a_collective,
        _wait_ignores_its_timeout,
        _tags_are_ignored,
        _peers_are_counted,
        _abort_fails_pending_and_later_operations,
    ):
        case()
        dist.barrier()
        passed.append(case.__name__)
    return passed


@pytest.mark.slow  # 19 s on the loaded 2-core machine
def test_the_rules_hold():
    out = spawn(_rules, 3, timeout_s=120)
    assert out[0] == out[1] == out[2] and len(out[0]) == 5


@pytest.mark.slow  # 5 s (a fresh interpreter imports torch)
def test_import_dssync_does_not_register_it():
    """``import dssync`` leaves the test backend out; ``import dssync.testing`` registers it."""
    import subprocess
    import sys

    code = (
        "import dssync, torch.distributed as dist; a = 'NCCL_LIKE' in dist.Backend._plugins; "
        "import dssync.testing; print(a, 'NCCL_LIKE' in dist.Backend._plugins)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(dssync.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["False", "True"], out.stderr


def _stalls(err_dir: str) -> None:
    from dssync.testing import use_nccl_like_world

    fd = os.open(Path(err_dir, f"err{dist.get_rank()}"), os.O_WRONLY | os.O_CREAT)
    os.dup2(fd, 2)
    use_nccl_like_world(timeout_s=2)
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        dist.irecv(torch.zeros(1), 1).wait()  # rank 1 never sends
    time.sleep(30)


@pytest.mark.slow  # 10 s
def test_the_watchdog_ends_a_process_whose_operation_is_pending_past_the_timeout(tmp_path):
    from dssync.testing.nccl_like import WATCHDOG_EXIT

    t0 = time.monotonic()
    with pytest.raises(WorkerError) as e:
        spawn(_stalls, 2, args=(str(tmp_path),), timeout_s=60)
    assert e.value.rank == 0 and f"exited with code {WATCHDOG_EXIT}" in str(e.value)
    assert time.monotonic() - t0 < 25  # the group's 2 s, not spawn's 60 s
    said = Path(tmp_path, "err0").read_text()
    assert "watchdog" in said and "recv" in said and "past the group's timeout of 2 s" in said
