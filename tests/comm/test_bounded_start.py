"""Start-up and lost peers are bounded by timeout_s and say what happened (issue 27, item 2).

Each rank writes what it raised, and after how long, into a file; a rank that must not reach
spawn's closing barrier (its group is broken) exits once every rank has written.
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from torch import nn

from dssync import DSSync, Shuffle
from dssync.errors import UsageError
from dssync.lab.launch import WorkerError, spawn


def _write(out_dir: str, **report) -> None:
    Path(out_dir, os.environ["RANK"]).write_text(json.dumps(report))


def _leave_when_all_wrote(out_dir: str, code: int = 3) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end and len(list(Path(out_dir).iterdir())) < 2:
        time.sleep(0.05)
    os._exit(code)


def _outcome(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
        return {"kind": "ok", "seconds": time.monotonic() - t0, "message": ""}
    except Exception as e:  # noqa: BLE001 - the test reads it
        return {"kind": type(e).__name__, "seconds": time.monotonic() - t0, "message": str(e)}


def _reports(out_dir: Path, world: int) -> list[dict]:
    return [json.loads(Path(out_dir, str(r)).read_text()) for r in range(world)]


def _odd_schedule(out_dir: str) -> None:
    """Rank 1 asks for Shuffle(3) on 2 ranks (it cannot fit) and stays alive after its error."""
    size = 2 if dist.get_rank() == 0 else 3
    _write(out_dir, **_outcome(lambda: DSSync(nn.Linear(4, 2), Shuffle(size), timeout_s=10)))
    _leave_when_all_wrote(out_dir)


def test_a_rank_that_refuses_the_schedule_tells_the_others_and_all_fail_at_once(tmp_path):
    """Rank 0 used to get gloo's raw error, or wait on the group's own timeout (30 minutes)."""
    with pytest.raises(WorkerError):
        spawn(_odd_schedule, 2, args=(str(tmp_path),), timeout_s=90, collective_timeout_s=60)
    reports = _reports(tmp_path, 2)
    assert [r["kind"] for r in reports] == ["UsageError", "UsageError"], reports
    for r in reports:
        assert r["seconds"] < 10, r  # at once, not at a timeout
        message = r["message"]
        assert "rank 0 has Shuffle(group_size=2" in message, message
        assert "rank 1 has Shuffle(group_size=3" in message, message
        assert "rank 1 refused the configuration" in message and "group_size=3" in message
    assert reports[0]["message"] == reports[1]["message"]


def _never_comes(out_dir: str) -> None:
    if dist.get_rank() == 1:
        time.sleep(12)  # never wraps its model within rank 0's timeout_s
        _write(out_dir, kind="slept", seconds=12, message="")
    else:
        _write(out_dir, **_outcome(lambda: DSSync(nn.Linear(4, 2), Shuffle(2), timeout_s=3)))
    _leave_when_all_wrote(out_dir)


def test_a_rank_that_never_comes_at_start_up_is_named_within_the_timeout(tmp_path):
    """It used to wait for the group's own timeout, then fail with gloo's error."""
    with pytest.raises(WorkerError):
        spawn(_never_comes, 2, args=(str(tmp_path),), timeout_s=90, collective_timeout_s=60)
    first = _reports(tmp_path, 2)[0]
    assert first["kind"] == "PeerLost", first
    assert 2.5 < first["seconds"] < 6, first  # timeout_s=3, not the peer's 12 s
    message = first["message"]
    assert "the start-up agreement" in message and "rank 1 never came" in message, message
    assert "silent for 3." in message and "past timeout_s=3" in message, message


def _partner_exits(out_dir: str) -> None:
    sync = DSSync(nn.Linear(4, 2), Shuffle(2, seed=0), timeout_s=30)
    if dist.get_rank() == 1:  # gone: its connections close (as when its process ends)
        del sync
        gc.collect()
        dist.destroy_process_group()
        gc.collect()
        _write(out_dir, kind="left", seconds=0, message="")
    else:
        time.sleep(1)
        _write(out_dir, **_outcome(sync.step))
    _leave_when_all_wrote(out_dir)


def test_a_partner_that_exited_is_reported_as_gone_and_after_how_long(tmp_path):
    """It was reported after about 10 s as "never came within timeout_s=120"."""
    with pytest.raises(WorkerError):
        spawn(_partner_exits, 2, args=(str(tmp_path),), timeout_s=90, collective_timeout_s=60)
    first = _reports(tmp_path, 2)[0]
    assert first["kind"] == "PeerLost", first
    assert first["seconds"] < 5, first  # not the roll call's 10 s window: the connection closed
    message = first["message"]
    assert "rank 1 never came" in message and "the connection closed after" in message, message
    assert "it exited or crashed" in message and "silent" not in message, message


def _stops_mid_transfer(out_dir: str) -> None:
    """Rank 2 sends its tag, then stops before its data (as a process stopped mid-transfer)."""
    import torch

    from dssync.comm import average_tensors

    if dist.get_rank() == 2:
        posted = dist.all_reduce

        def stop_before_data(t, *args, **kwargs):
            if t.dtype != torch.int64:  # the tag went; the data does not, for 8 s
                time.sleep(8)
            return posted(t, *args, **kwargs)

        dist.all_reduce = stop_before_data
    tensors = [torch.ones(1000)]
    _write(out_dir, **_outcome(lambda: average_tensors(tensors, None, 3, timeout_s=3)))
    _leave_when_all_wrote(out_dir)


def test_a_member_that_stops_mid_transfer_in_a_global_average_is_named(tmp_path):
    """An evaluation's global average used to say only that every member came, then it stalled."""
    with pytest.raises(WorkerError):
        spawn(_stops_mid_transfer, 3, args=(str(tmp_path),), timeout_s=90, collective_timeout_s=60)
    for report in _reports(tmp_path, 2):  # rank 2 is killed asleep once the others wrote
        assert report["kind"] == "PeerLost", report
        message = report["message"]
        assert "rank 2 came, then stopped answering mid-transfer" in message, message
        assert "past timeout_s=3" in message, message


def test_not_initialized_says_the_script_must_create_the_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(UsageError, match="init_process_group") as e:
        DSSync(nn.Linear(2, 2))
    assert "does not create the group" in str(e.value)


def test_a_wait_every_member_reached_says_whether_it_stalled_or_broke():
    from dssync.comm.exchange import lost

    stalled = lost([], silent=True, waited=10.0, timeout_s=10)
    assert "stalled for 10.0 s, past timeout_s=10" in stalled and "stopped mid-transfer" in stalled
    broke = lost([], silent=False, waited=0.3, timeout_s=10)
    assert "failed after 0.3 s (a connection broke)" in broke
    assert "rank 2 never came: silent" in lost([2], silent=True, waited=10.0, timeout_s=10)
    stopped = lost([2], silent=True, waited=10.0, timeout_s=10, came=True)
    assert "rank 2 came, then stopped answering mid-transfer" in stopped
    closed = lost([2], silent=False, waited=3.5, timeout_s=10, came=True)
    assert "rank 2 came, then went missing mid-transfer" in closed and "never" not in closed
