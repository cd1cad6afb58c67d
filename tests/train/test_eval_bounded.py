"""An evaluation's collectives are bounded by the run's timeout_s and name who never came."""

from __future__ import annotations

import json
import time

import pytest
import torch.distributed as dist

from dssync.errors import PeerLost
from dssync.lab.launch import WorkerError, spawn
from dssync.lab.train.summary import slowest


def _timing_with_a_silent_rank(path: str):
    if dist.get_rank() == 1:
        time.sleep(8)  # never comes to the evaluation (stopped, hung)
        return None
    t0 = time.monotonic()
    try:
        slowest(1.0, timeout_s=2)
    except PeerLost as e:
        with open(path, "w") as f:
            json.dump([str(e), e.ranks, time.monotonic() - t0], f)
    return None  # the world group is broken now: the harness's closing barrier fails


@pytest.mark.timeout(120)
def test_the_evaluation_timing_waits_timeout_s_and_names_the_silent_rank(tmp_path):
    out = tmp_path / "lost.json"
    with pytest.raises(WorkerError):
        spawn(_timing_with_a_silent_rank, 2, args=(str(out),), timeout_s=60, collective_timeout_s=5)
    assert out.is_file(), "a rank that never came did not raise PeerLost (a raw error?)"
    message, ranks, waited = json.loads(out.read_text())
    assert ranks == [1], message
    assert "evaluation's timing" in message and "timeout_s=2" in message, message
    assert waited < 6  # its 2 s, then at most a short roll call
