"""Several synchronization methods on one workload, for several seeds, on one runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dssync.experiments.runners import Runner
from dssync.methods import for_method
from dssync.train.config import TrainConfig

OnRun = Callable[[str, int, dict[str, Any]], None]


def compare(
    base: TrainConfig,
    methods: list[str],
    seeds: list[int],
    runner: Runner,
    on_run: OnRun | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every method with every seed; returns the runs of each method.

    ``on_run(method, seed, summary)`` is called after each run (progress lines).
    """
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for seed in seeds:
        for method in methods:
            summary = runner.run(replace(for_method(base, method), seed=seed))
            runs[method].append(summary)
            if on_run is not None:
                on_run(method, seed, summary)
    return runs
