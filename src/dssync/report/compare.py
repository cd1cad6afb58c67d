"""Run several synchronization methods on one workload, for several seeds, and summarize."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dssync.report.summary import method_summary
from dssync.train.config import TrainConfig
from dssync.train.run import run_training


class Runner:
    """Runs one configuration: local worker processes, or workers inside an emulated cluster."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.where = f"local processes (gloo on loopback, {workers} workers)"

    def run(self, cfg: TrainConfig) -> dict[str, Any]:
        summary = run_training(cfg, workers=self.workers)
        assert summary is not None
        return summary


class ClusterRunner(Runner):
    """Runs each configuration with one worker per slot of an emulated cluster that is up."""

    def __init__(self, cluster, timeout_s: float = 3600.0) -> None:
        super().__init__(cluster.spec.world_size)
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.where = f"emulated cluster {cluster.spec.name} ({cluster.spec.world_size} workers)"

    def run(self, cfg: TrainConfig) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="dssync-compare-") as tmp:
            cfg_path, out_path = Path(tmp) / "config.json", Path(tmp) / "summary.json"
            cfg_path.write_text(json.dumps(asdict(cfg)))
            result = self.cluster.run([sys.executable, "-m", "dssync.train.worker", str(cfg_path), str(out_path)],
                                      timeout_s=self.timeout_s, log_dir=Path(tmp))
            if not result.ok:
                logs = sorted(Path(tmp).glob("*.log"))
                tail = logs[0].read_text()[-2000:] if logs else ""
                raise RuntimeError(f"{cfg.sync} seed {cfg.seed}: {result.summary()}\n{tail}")
            return json.loads(out_path.read_text())


@contextlib.contextmanager
def runner_for(topology: str | None, workers: int) -> Iterator[Runner]:
    """A local runner, or one on an emulated cluster built from ``topology`` and torn down after."""
    if topology is None:
        yield Runner(workers)
        return
    from dssync.cluster import Cluster, load_topology

    with Cluster(load_topology(topology)) as cluster:
        yield ClusterRunner(cluster)


def compare(base: TrainConfig, methods: list[str], seeds: list[int], runner: Runner,
            on_run=None) -> dict[str, list[dict[str, Any]]]:
    """Every method with every seed; returns the runs of each method."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for seed in seeds:
        for method in methods:
            summary = runner.run(replace(base, sync=method, seed=seed))
            runs[method].append(summary)
            if on_run is not None:
                on_run(method, seed, summary)
    return runs


def summarize(runs: dict[str, list[dict[str, Any]]], target: float | None = None,
              reference: str = "bsp") -> dict[str, Any]:
    """Per-method figures. The target defaults to the reference method's mean final metric."""
    source = "given"
    if target is None:
        ref = runs.get(reference) or next(iter(runs.values()))
        target = sum(r["final_metric"] for r in ref) / len(ref)
        source = f"mean final metric of {reference if reference in runs else next(iter(runs))}"
    return {"target": target, "target_source": source,
            "methods": {m: method_summary(rs, target) for m, rs in runs.items()}}
