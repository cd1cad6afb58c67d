"""Where a training run happens: local worker processes, or torchrun on every host of an emulated cluster."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dssync.train.config import TrainConfig
from dssync.train.run import run_training

if TYPE_CHECKING:
    from dssync.cluster import Cluster


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
        summary = run_training(cfg, workers=self.workers)
        assert summary is not None
        return summary


class ClusterRunner(Runner):
    """Runs each configuration on an emulated cluster that is up: one torchrun per host, as on
    real machines (:meth:`dssync.cluster.Cluster.launch`), each starting ``dssync.train.worker``.

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
            argv = [sys.executable, "-m", "dssync.train.worker", str(cfg_path), str(out_path)]
            result = self.cluster.run(argv, timeout_s=self.timeout_s, log_dir=Path(tmp))
            if not result.ok:
                host = result.failed_host if result.failed_host is not None else 0
                log = Path(tmp) / f"host{host}.log"
                tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
                raise RuntimeError(f"{cfg.sync} seed {cfg.seed}: {result.summary()}\n{tail}")
            return json.loads(out_path.read_text())


@contextlib.contextmanager
def runner_for(cluster: str | None, workers: int) -> Iterator[Runner]:
    """A local runner, or one on an emulated cluster built from the cluster spec ``cluster``
    (a shipped name or a file) and torn down after."""
    if cluster is None:
        yield Runner(workers)
        return
    from dssync.cluster import Cluster, load_cluster

    with Cluster(load_cluster(cluster)) as built:
        yield ClusterRunner(built)
