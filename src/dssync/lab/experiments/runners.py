"""Where a training run happens: local worker processes, or torchrun on every host of an emulated cluster."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dssync.errors import UsageError
from dssync.lab.config import TrainConfig
from dssync.lab.methods import configure, is_elastic
from dssync.lab.train.data import planned_steps
from dssync.lab.train.run import run_training, spawn_series

if TYPE_CHECKING:
    from dssync.lab.cluster import Cluster
    from dssync.lab.cluster.workers import RunResult


# How long a launch may take to exit after its last run's summary is written.
EXIT_GRACE_S = 60.0


class RunFailed(RuntimeError):
    """A run that ended in an error on the cluster (a host's torchrun failed or timed out): the
    comparison records it as a seed that never reached the target and goes on."""


# Called as each run of a series ends: its index, and its summary or what ended it.
Each = Callable[[int, "dict[str, Any] | RunFailed"], None]


class Arrivals:
    """The summaries a series of ``n`` runs writes in ``folder`` (``outs[i]`` for run ``i``),
    each given to ``each`` as it appears, in order."""

    def __init__(self, folder: Path, n: int, each: Each) -> None:
        self.outs = [folder / f"summary{i}.json" for i in range(n)]
        self.each = each
        self.given = 0

    def take(self) -> bool:
        """Report the summaries written since the last call; whether there was any."""
        start = self.given
        while self.given < len(self.outs) and self.outs[self.given].is_file():
            self.each(self.given, json.loads(self.outs[self.given].read_text()))
            self.given += 1
        return self.given > start


class Runner:
    """Runs one configuration on local worker processes (gloo on loopback).

    Example::

        summary = Runner(workers=2).run(TrainConfig(workload="digits", epochs=1))
        summary["final_metric"]
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.where = f"local processes (gloo on loopback, {workers} workers)"

    def run(self, cfg: TrainConfig) -> dict[str, Any]:
        """One run; an elastic method's (:func:`dssync.lab.methods.is_elastic`) on torchft's
        launcher, one process per replica, ``workers`` replicas that must all finish."""
        if is_elastic(cfg.sync):
            from dssync.lab.elastic.launch import run_elastic

            return run_elastic(configure(cfg), self.workers, say=lambda line: None)
        summary = run_training(cfg, workers=self.workers)
        assert summary is not None
        return summary

    def run_all(self, cfgs: Sequence[TrainConfig], each: Each) -> None:
        """Every config, in order, in one start of the worker processes
        (:func:`dssync.lab.train.run.spawn_series`); ``each(i, summary)`` as run ``i`` ends. An error
        (a bad configuration, a bug, a worker that died) ends them all and is raised. With an
        elastic method among them, each run starts its own processes."""
        if len(cfgs) < 2 or any(is_elastic(c.sync) for c in cfgs):
            for i, cfg in enumerate(cfgs):
                each(i, self.run(cfg))
            return
        with tempfile.TemporaryDirectory(prefix="dssync-compare-") as tmp:
            arrivals = Arrivals(Path(tmp), len(cfgs), each)
            try:
                spawn_series(
                    list(cfgs), self.workers, [str(o) for o in arrivals.outs], arrivals.take
                )
            finally:
                arrivals.take()  # what was written before the end, an error's included


class ClusterRunner(Runner):
    """Runs each configuration on an emulated cluster that is up: one torchrun per host, as on
    real machines (:meth:`dssync.lab.cluster.Cluster.launch`), each starting ``dssync.lab.train.worker``.

    Example::

        with Cluster(load_cluster("s2-inter-rack")) as cluster:
            summary = ClusterRunner(cluster).run(TrainConfig(workload="digits", epochs=1))
    """

    def __init__(self, cluster: Cluster, timeout_s: float = 3600.0) -> None:
        super().__init__(cluster.spec.world_size)
        self.cluster = cluster
        self.timeout_s = timeout_s
        spec = cluster.spec
        self.where = (
            f"emulated cluster {spec.name} ({spec.world_size} workers: torchrun on "
            f"{spec.num_hosts} hosts x {spec.workers_per_host})"
        )

    def run(self, cfg: TrainConfig) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="dssync-compare-") as tmp:
            cfg_path, out_path = Path(tmp) / "config.json", Path(tmp) / "summary.json"
            cfg_path.write_text(json.dumps(asdict(cfg)))
            argv = [sys.executable, "-m", "dssync.lab.train.worker", str(cfg_path), str(out_path)]
            spec = self.cluster.spec
            events = None
            if spec.events:
                argv.append(str(Path(tmp) / "progress.json"))
                total = planned_steps(cfg, spec.world_size)
                events = StepEvents(self.cluster, Path(argv[-1]), total).start()
            try:
                result = self.cluster.run(argv, timeout_s=self.timeout_s, log_dir=Path(tmp))
            finally:
                if events is not None:
                    events.stop()
            if not result.ok:
                raise self._failed(cfg, result, Path(tmp))
            summary = json.loads(out_path.read_text())
            if events is not None:
                summary["link_events"] = events.applied
            return summary

    def run_all(self, cfgs: Sequence[TrainConfig], each: Each) -> None:
        """One torchrun launch for all of ``cfgs`` (:func:`dssync.lab.train.run.train_series`);
        ``each(i, summary)`` as run ``i`` ends, or ``each(i, RunFailed)`` for a run that failed on
        the cluster, after which a new launch makes the rest.

        A cluster with link events changes its links at fractions of each run, so it launches
        once per run (:meth:`run`).
        """
        elastic = sorted({c.sync for c in cfgs if is_elastic(c.sync)})
        if elastic:
            raise UsageError(
                f"{', '.join(elastic)} run on local processes only: one emulated host per "
                "replica is not built; drop --cluster for them"
            )
        if self.cluster.spec.events or len(cfgs) < 2:
            for i, cfg in enumerate(cfgs):
                try:
                    outcome: dict[str, Any] | RunFailed = self.run(cfg)
                except RunFailed as e:
                    outcome = e
                each(i, outcome)
            return
        start = 0
        while start < len(cfgs):
            start += self._series(list(cfgs[start:]), lambda i, o, at=start: each(at + i, o))

    def _series(self, cfgs: list[TrainConfig], each: Each) -> int:
        """One launch of ``cfgs``: ``each`` for the runs in order, up to the first failed run,
        which ends it as a RunFailed (a launch that fails between runs blames the next); the
        number of runs reported. Each run has ``timeout_s`` from the end of the one before (the
        first, from the launch); the launch has :data:`EXIT_GRACE_S` to exit after the last."""
        with tempfile.TemporaryDirectory(prefix="dssync-compare-") as tmp:
            arrivals = Arrivals(Path(tmp), len(cfgs), each)
            runs = [
                {"config": asdict(c), "summary": str(o)}
                for c, o in zip(cfgs, arrivals.outs, strict=True)
            ]
            (Path(tmp) / "runs.json").write_text(json.dumps(runs))
            argv = [sys.executable, "-m", "dssync.lab.train.worker", "--runs", f"{tmp}/runs.json"]
            agents = self.cluster.launch(argv, log_dir=Path(tmp), join_timeout_s=self.timeout_s)
            deadline = time.monotonic() + self.timeout_s  # each run has timeout_s of its own
            try:
                while True:
                    result = agents.poll(deadline)
                    if arrivals.take():
                        deadline = time.monotonic() + (
                            self.timeout_s if arrivals.given < len(cfgs) else EXIT_GRACE_S
                        )
                    if result is not None:
                        break
                    time.sleep(0.1)
            finally:
                agents.kill()
            given = arrivals.given
            if given < len(cfgs):
                each(given, self._failed(cfgs[given], result, Path(tmp)))
                given += 1
            return given

    def _failed(self, cfg: TrainConfig, result: RunResult, logs: Path) -> RunFailed:
        """What ended ``cfg``'s run on the cluster: a worker's own error from the failing
        host's log, the launch's outcome and the log's tail."""
        host = result.failed_host if result.failed_host is not None else 0
        log = logs / f"host{host}.log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        cause = _cause(text)
        return RunFailed(
            f"{cfg.sync} seed {cfg.seed}: {cause or result.summary()}\n"
            f"{result.summary()}\n{text[-2000:]}"
        )


def _cause(log: str) -> str | None:
    """The first error a worker raised, from a host's log (``PeerLost: ...``), not the launcher's
    traceback that follows it; None when there is none."""
    found = WORKER_ERROR.search(log)
    return found.group(0)[:300] if found else None


WORKER_ERROR = re.compile(r"\b(PeerLost|SyncError|UsageError|DSSyncError|DistStoreError): .*")


class StepEvents:
    """Applies a cluster spec's events at fractions of a training run's steps (``at_fraction``
    of ``total``; ``at_s`` counts from the first step), read from the progress file rank 0
    writes; every link is set back to its spec rate when stopped, for the next run.

    Example::

        events = StepEvents(cluster, Path("progress.json"), total=60).start()
        ...  # the run
        events.stop(); events.applied      # [(step, link, Mbit/s), ...]
    """

    def __init__(self, cluster: Cluster, progress: Path, total: int) -> None:
        self.cluster, self.progress, self.total = cluster, progress, total
        self.pending = sorted(cluster.spec.events, key=lambda e: e.at_fraction or 0.0)
        self.applied: list[tuple[int, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dssync-events", daemon=True)
        self._first: float | None = None

    def start(self) -> StepEvents:
        self._thread.start()
        return self

    def _due(self, event: Any, step: int) -> bool:
        if event.at_fraction is not None:
            return step >= event.at_fraction * self.total
        return self._first is not None and time.monotonic() - self._first >= event.at_s

    def _loop(self) -> None:
        while self.pending and not self._stop.wait(0.02):
            try:
                step = json.loads(self.progress.read_text())["step"]
            except (OSError, ValueError, KeyError):
                continue
            self._first = self._first or time.monotonic()
            while self.pending and self._due(self.pending[0], step):
                e = self.pending.pop(0)
                self.cluster.set_rate(e.link, e.rate_mbit)
                self.applied.append((step, e.link, e.rate_mbit))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for link, rate in self.cluster.spec.link_rates().items():
            self.cluster.set_rate(link, rate)


@contextlib.contextmanager
def runner_for(cluster: str | None, workers: int) -> Iterator[Runner]:
    """A local runner, or one on an emulated cluster built from the cluster spec ``cluster``
    (a shipped name or a file) and torn down after."""
    if cluster is None:
        yield Runner(workers)
        return
    from dssync.lab.cluster import Cluster, load_cluster

    with Cluster(load_cluster(cluster)) as built:
        yield ClusterRunner(built)
