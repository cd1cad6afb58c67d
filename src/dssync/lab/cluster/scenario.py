"""Timed rate changes: apply a cluster spec's events to a live cluster from a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dssync.lab.cluster.spec import Event


@dataclass(frozen=True)
class Step:
    """One planned change: at ``at_s`` seconds after the start, set ``link`` to ``rate_mbit``."""

    at_s: float
    link: str
    rate_mbit: float


def plan(events: Sequence[Event], duration_s: float | None = None) -> list[Step]:
    """Turn events (``at_s`` or ``at_fraction`` of ``duration_s``) into steps sorted by time."""
    steps = [Step(e.time_in(duration_s), e.link, e.rate_mbit) for e in events]
    return sorted(steps, key=lambda s: s.at_s)


class Scenario:
    """Applies planned rate changes at their times in a background thread; stoppable.

    Example::

        with Cluster(spec) as cluster:
            with Scenario(cluster.set_rate, spec.events, duration_s=60):
                cluster.run(argv, timeout_s=90)
    """

    def __init__(
        self,
        set_rate: Callable[[str, float], None],
        events: Sequence[Event],
        duration_s: float | None = None,
    ) -> None:
        self.steps = plan(events, duration_s)
        self.applied: list[tuple[float, Step]] = []
        self.error: BaseException | None = None
        self._set_rate = set_rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dssync-scenario", daemon=True)

    def start(self) -> Scenario:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def __enter__(self) -> Scenario:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        for step in self.steps:
            wait = self._start + step.at_s - time.monotonic()
            if self._stop.wait(max(wait, 0.0)):
                return
            try:
                self._set_rate(step.link, step.rate_mbit)
            except Exception as exc:  # reported through .error; the run goes on
                self.error = exc
                return
            self.applied.append((time.monotonic() - self._start, step))
