"""tools/goodput_elastic.py reads the elastic step records: heals of live replicas, quorum sizes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from goodput_elastic import live_heals, quorum_sizes  # noqa: E402


def record(pid: int, healed: bool | None, members: list[int] | None = None) -> dict:
    return {"pid": pid, "replica": pid % 10, "step": 1, "healed": healed, "members": members}


def test_a_heal_counts_as_live_only_when_its_process_had_stepped_before():
    steps = [
        record(10, False, [0, 1, 2]),
        record(11, False, [0, 1, 2]),
        record(21, True, [0, 1]),  # a restarted process healed at its first step: no
        record(10, True, [0, 1]),  # process 10 stepped before: left out and healed back
        record(10, False, [0, 1]),
    ]
    assert live_heals(steps) == 1
    assert quorum_sizes(steps) == {"2": 3, "3": 2}


def test_averaging_every_second_step_counts_each_heal_once_and_a_restart_as_none():
    steps = [
        record(10, None, [0, 1]),
        record(10, False, [0, 1]),  # averaged at its step 2
        record(21, None, [0, 1]),  # a restarted process: its first step does not average
        record(21, True, [0, 1]),  # its first averaging heals it: a restart, not a live heal
        record(10, None, [0]),
        record(10, True, [0, 1]),  # left out, healed back: one live heal
        record(10, None, [0, 1]),
    ]
    assert live_heals(steps) == 1


def test_a_method_that_does_not_record_heals_has_none():
    steps = [record(10, None, [0, 1]), record(11, None, None)]
    assert live_heals(steps) is None
    assert quorum_sizes(steps) == {"2": 1}
