"""tools/goodput_restarts.py reads rank 0's step record into the steps a torchrun job took."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from goodput_restarts import longest_gaps, steps_taken  # noqa: E402


def test_steps_done_again_after_a_restart_are_counted_from_its_checkpoint():
    # steps 1..250 (some polls missed), killed; resumed from the checkpoint at 200 (first seen: 203)
    trace = [(0.0, 1), (1.0, 120), (2.0, 250), (9.0, 203), (10.0, 300)]
    taken, resumed = steps_taken(trace, every=100)
    assert resumed == [200]
    assert taken == 250 + (300 - 200)  # 50 steps done twice


def test_a_restart_that_resumes_past_the_last_step_seen_is_no_step_back():
    trace = [(0.0, 1), (1.0, 100), (5.0, 101), (6.0, 150)]  # checkpoint at 100, killed right after
    assert steps_taken(trace, every=100) == (150, [])


def test_the_stall_of_a_kill_is_the_longest_gap_near_it():
    trace = [(t, i) for i, t in enumerate([0.0, 0.1, 0.2, 4.0, 4.1])]
    assert longest_gaps(trace, kills=[0.25]) == [3.8]
    assert longest_gaps(trace, kills=[100.0]) == []
