from __future__ import annotations

import time

from dssync.lab.cluster import Event, Scenario, plan


def test_plan_sorts_and_resolves_fractions():
    events = [Event("host:1", 10, at_fraction=0.5), Event("rack_uplink", 5, at_s=1.0)]
    steps = plan(events, duration_s=10)
    assert [(s.at_s, s.link) for s in steps] == [(1.0, "rack_uplink"), (5.0, "host:1")]


def test_scenario_applies_in_order_at_the_right_time():
    calls = []
    events = [Event("rack_uplink", 100, at_s=0.3), Event("rack_uplink", 1000, at_s=0.1)]
    start = time.monotonic()
    with Scenario(
        lambda link, rate: calls.append((time.monotonic() - start, link, rate)), events
    ) as scenario:
        time.sleep(0.6)
    assert [c[2] for c in calls] == [1000, 100]
    assert 0.05 < calls[0][0] < 0.25 and 0.25 < calls[1][0] < 0.5
    assert len(scenario.applied) == 2 and scenario.error is None


def test_scenario_stop_skips_later_events():
    calls = []
    scenario = Scenario(lambda link, rate: calls.append(rate), [Event("host:0", 1, at_s=5)])
    scenario.start()
    t = time.monotonic()
    scenario.stop()
    assert time.monotonic() - t < 1 and calls == []


def test_scenario_reports_errors():
    def broken(link: str, rate: float) -> None:
        raise RuntimeError("tc failed")

    with Scenario(broken, [Event("host:0", 1, at_s=0)]) as scenario:
        time.sleep(0.2)
    assert isinstance(scenario.error, RuntimeError)
