"""Several synchronization methods on one workload, for several seeds, on one runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from dssync.lab.config import TrainConfig
from dssync.lab.experiments.runners import RunFailed, Runner
from dssync.lab.methods import for_method

OnRun = Callable[[str, int, dict[str, Any]], None]
OnFail = Callable[[str, int, str], None]


@dataclass
class Results:
    """Every method's finished runs, and the runs that failed (``{"seed", "error"}``) apart."""

    runs: dict[str, list[dict[str, Any]]]
    failed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def compare(
    base: TrainConfig,
    methods: list[str],
    seeds: list[int],
    runner: Runner,
    on_run: OnRun | None = None,
    on_fail: OnFail | None = None,
) -> Results:
    """Every method with every seed, seed by seed, in one start of the workers
    (:meth:`dssync.lab.experiments.runners.Runner.run_all`).

    ``on_run(method, seed, summary)`` is called after each run (progress lines). A run that
    fails on the runner (:class:`RunFailed`: a host's job died or timed out) is kept in
    ``failed`` with its error's first line, reported through ``on_fail(method, seed, error)``,
    and the race goes on: that seed counts as one that never reached the target. Other errors
    (a bad configuration, a bug) end the comparison.
    """
    out = Results({m: [] for m in methods}, {})
    plan = [(method, seed) for seed in seeds for method in methods]
    cfgs = [replace(for_method(base, method), seed=seed) for method, seed in plan]

    def each(i: int, outcome: dict[str, Any] | RunFailed) -> None:
        method, seed = plan[i]
        if isinstance(outcome, RunFailed):
            error = _first_line(str(outcome))
            out.failed.setdefault(method, []).append({"seed": seed, "error": error})
            if on_fail is not None:
                on_fail(method, seed, str(outcome))
            return
        out.runs[method].append(outcome)
        if on_run is not None:
            on_run(method, seed, outcome)

    runner.run_all(cfgs, each)
    return out


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), text)[:300]
