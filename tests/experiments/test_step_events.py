"""A cluster spec's events fire at fractions of a compare run's steps, and links go back after."""

from __future__ import annotations

import json
import time

from dssync.lab.cluster import load_cluster
from dssync.lab.experiments.runners import StepEvents


class FakeCluster:
    def __init__(self) -> None:
        self.spec = load_cluster("s4-dynamic")  # uplink to 100 at 1/3, back to 1000 at 2/3
        self.rates: list[tuple[str, float | None]] = []

    def set_rate(self, link: str, rate: float | None) -> None:
        self.rates.append((link, rate))


def _wait_for(cond, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)


def test_events_follow_the_steps_and_every_link_is_reset_when_stopped(tmp_path):
    cluster = FakeCluster()
    progress = tmp_path / "progress.json"
    events = StepEvents(cluster, progress, total=60).start()
    try:
        for step in (5, 19, 20, 21):
            progress.write_text(json.dumps({"step": step}))
            time.sleep(0.1)
        _wait_for(lambda: len(events.applied) == 1)
        assert events.applied == [(20, "rack_uplink", 100.0)]  # 0.333 * 60 = 19.98
        progress.write_text(json.dumps({"step": 41}))
        _wait_for(lambda: len(events.applied) == 2)
        assert events.applied[1] == (41, "rack_uplink", 1000.0)
    finally:
        events.stop()
    reset = cluster.rates[2:]
    assert dict(reset) == cluster.spec.link_rates()


def test_a_run_that_never_writes_progress_changes_nothing_but_the_reset(tmp_path):
    cluster = FakeCluster()
    events = StepEvents(cluster, tmp_path / "none.json", total=60).start()
    time.sleep(0.1)
    events.stop()
    assert events.applied == [] and dict(cluster.rates) == cluster.spec.link_rates()
