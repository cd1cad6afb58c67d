"""``dssync bench``: every method on every scenario of the emulated cluster, same model, same run.

For each scenario a cluster is built once; each method then runs under one torchrun per host,
inside the host namespaces, as on real machines (:mod:`dssync.lab.bench.cluster_worker` on every
rank; torchrun's rendezvous decides which ranks land on which host, and each rank reports its host
with its timings, ``rank_hosts``). The parent snapshots the link byte counters and the loss
counters (tbf drops, TCP retransmissions and timeouts) around each run, applies a scenario's
timed rate changes with :class:`Scenario` (started when rank 0 reports its warm-up done, for a
run planned at its warm-up pace), and reads back the per-rank timings.

Example::

    results = run_bench(["s2-inter-rack"], ["ddp", "dssync-topo"], BenchSettings(params=2_000_000))
    results["s2-inter-rack"]["dssync-topo"]["iter_time_s"]
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dssync.comm.wire import codec_for
from dssync.lab.bench.bounds import lower_bound
from dssync.lab.bench.timings import recovery, summarize
from dssync.lab.cluster import Cluster, ClusterError, Scenario, diff, load_cluster
from dssync.lab.methods import get_method

SCENARIOS = ("s1-homogeneous", "s2-inter-rack", "s3-slow-host", "s4-dynamic")
# The default set of methods (names from dssync.lab.methods).
METHODS = ("ddp", "hierarchical", "dssync", "dssync-topo")
# The blocking method each overlapped one hides (for the ratio to max(compute, its averaging)).
BLOCKING = {"dssync-overlap": "dssync", "dssync-topo-overlap": "dssync-topo"}


@dataclass
class BenchSettings:
    """Settings shared by every run of a benchmark.

    Example::

        BenchSettings(params=4_000_000, steps=30, dynamic_steps=120)
    """

    params: int = 10_000_000
    steps: int = 30
    dynamic_steps: int = 120
    warmup: int = 3
    repeat: int = 8
    probe: bool = True
    timeout_s: float = 600.0
    out_dir: Path = Path("dssync-bench")
    device: str = "auto"
    compute_ms: float = 0.0
    compute_kind: str = "cpu"
    # DS-Sync options given on the command line (every, outer, overlap, replan); each method
    # takes those it accepts (dssync.lab.methods.for_method), its preset fills in the rest.
    options: dict[str, Any] = field(default_factory=dict)


def run_bench(
    scenarios: list[str],
    methods: list[str],
    settings: BenchSettings,
    log: Callable[[str], None] = print,
    failed: dict[str, dict[str, str]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Results by scenario, then by method; see :func:`dssync.lab.bench.timings.summarize` and
    :func:`run_method` for the keys.

    A method whose run fails on the cluster (a worker's error, a timeout) is left out of the
    results and the bench goes on with the next; with ``failed`` given, its error is kept there
    by scenario and method, else the first failure is raised.
    """
    for method in methods:
        get_method(method)  # before any cluster is built
    results: dict[str, dict[str, Any]] = {}
    for name in scenarios:
        spec = load_cluster(name)
        with Cluster(spec) as cluster:
            results[spec.name] = {}
            for method in methods:
                log(f"{spec.name}: {method} ...")
                try:
                    results[spec.name][method] = run_method(cluster, method, settings)
                except (ClusterError, OSError, KeyError, ValueError) as exc:
                    # a run's error, or timings it never wrote: the others still count
                    if failed is None:
                        raise
                    log(f"{spec.name}: {method} failed: {exc}")
                    failed.setdefault(spec.name, {})[method] = str(exc)
        ddp = next((r for m, r in results[spec.name].items() if get_method(m).name == "bsp"), None)
        for m, r in results[spec.name].items():
            r["ratio_to_ddp"] = r["iter_time_s"] / ddp["iter_time_s"] if ddp else None
            blocking = results[spec.name].get(BLOCKING.get(get_method(m).name, ""))
            if blocking is not None:  # the goal of overlap: max(compute, blocking averaging)
                floor = max(r["compute_s"], blocking["sync_time_s"])
                r["ratio_to_hidden"] = r["iter_time_s"] / floor
                r["ratio_to_hidden_per_step"] = per_step_floor(r, blocking, settings.warmup)
    return results


def per_step_floor(
    overlapped: dict[str, Any], blocking: dict[str, Any], warmup: int
) -> float | None:
    """The overlapped method's mean step over the mean of max(C, A_t), step by step.

    ``A_t`` is step t's averaging in the blocking run (its step minus that run's compute; the
    same schedule, so the same groups at step t); C is the overlapped run's compute. Where some steps' averaging outlasts the compute
    (a topology-aware plan's crossing steps) even a perfect overlap pays those steps in full,
    which max(C, mean A) does not count. Steps after warm-up, from the per-step timelines.
    """
    c, cb = overlapped["compute_s"], blocking["compute_s"]
    ours = [p["iter_s"] for p in overlapped["timeline"][warmup:]]
    theirs = [p["iter_s"] for p in blocking["timeline"][warmup:]]
    n = min(len(ours), len(theirs))
    if n == 0:
        return None
    floor = sum(max(c, t - cb) for t in theirs[:n]) / n
    return (sum(ours[:n]) / n) / floor


def run_method(cluster: Cluster, method: str, s: BenchSettings) -> dict[str, Any]:
    """One method on a live cluster: launch, apply events, wait, read timings and link bytes."""
    spec = cluster.spec
    steps = s.dynamic_steps if spec.events else s.steps
    work = Path(s.out_dir) / spec.name / method
    work.mkdir(parents=True, exist_ok=True)
    for f in work.glob("*.json"):
        f.unlink()
    for link, rate in spec.link_rates().items():
        cluster.set_rate(link, rate)
    argv = [
        sys.executable,
        "-m",
        "dssync.lab.bench.cluster_worker",
        "--method",
        method,
        "--params",
        str(s.params),
        "--steps",
        str(steps),
        "--warmup",
        str(s.warmup),
        "--repeat",
        str(s.repeat),
        "--timeout",
        str(min(s.timeout_s, 300.0)),
        "--out",
        str(work),
        "--device",
        s.device,
        "--compute-ms",
        str(s.compute_ms),
        "--compute-kind",
        s.compute_kind,
    ]
    if s.probe:
        argv.append("--probe")
    if s.options:
        argv += ["--options", json.dumps(s.options)]
    before, lost_before = cluster.link_bytes(), cluster.losses()
    agents = cluster.launch(argv, log_dir=work / "logs", join_timeout_s=s.timeout_s)
    events = _WhenWarm(cluster, work / "progress.json", steps - s.warmup, bool(spec.events))
    try:
        result = agents.wait(s.timeout_s)
    finally:
        events.stop()
        for link, rate in spec.link_rates().items():
            cluster.set_rate(link, rate)
    if not result.ok:
        raise ClusterError(
            f"{spec.name} / {method}: {result.summary()}; see the logs in {work / 'logs'}"
        )
    cluster_bytes_after = cluster.link_bytes()
    moved = diff(cluster_bytes_after, before)
    lost = cluster.losses() - lost_before
    ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(spec.world_size)]
    out = summarize(ranks, s.warmup)
    out["rank_hosts"] = [r.get("host") for r in ranks]  # as torchrun placed them
    out["options"] = ranks[0].get("options", {})  # what the method ran with
    out["compute_s"] = sum(r["compute_s"] for r in ranks) / len(ranks)
    out["exposed_s"] = max(out["iter_time_s"] - out["compute_s"], 0.0)
    nbytes = bound_bytes(out["options"], s.params)
    packed = compressed(out["options"])
    out["lower_bound_s"] = lower_bound(spec, method, nbytes, s.repeat, compressed=packed)
    out["step_bound_s"] = lower_bound(
        spec, method, nbytes, s.repeat, per_step=True, compressed=packed
    )
    # from rank 0's end of warm-up: the timed steps' traffic, without the start-up (the
    # rendezvous, the first broadcast, a topology-aware preset's link probe), over the steps
    # rank 0 began after the counters were read (a step in flight then counts its rest: if
    # anything, more bytes a step than were sent)
    after = sum(1 for t0, _, _ in ranks[0]["records"] if t0 >= events.warm_at)
    if events.bytes_at_warm is not None and after:
        steady = diff(cluster_bytes_after, events.bytes_at_warm)
        out["bytes_per_iter"] = {k: v.total / after for k, v in steady.items()}
        out["bytes_counted_from"] = "warm-up"
    else:
        out["bytes_per_iter"] = {k: v.total / steps for k, v in moved.items()}
        out["bytes_counted_from"] = "launch"
    out["max_link_bytes_per_iter"] = max(out["bytes_per_iter"].values())
    out["steps"] = steps
    out["tbf_drops"] = lost.drops
    out["tcp_retransmits"], out["tcp_timeouts"] = lost.retransmits, lost.timeouts
    if spec.events:
        contended = {**spec.link_rates()}
        for e in spec.events[:1]:
            contended.update({k: e.rate_mbit for k in spec.expand_link(e.link)})
        out["lower_bound_contended_s"] = lower_bound(
            spec, method, nbytes, s.repeat, contended, compressed=packed
        )
        out.update(recovery(out["timeline"], events.applied, s.warmup, s.repeat))
    return out


def wire_share(options: dict[str, Any]) -> float:
    """The share of a whole fp32 model that one iteration of a method with ``options`` puts on
    the wire, on average: the wire format's bytes over fp32's, one averaging every ``every``
    steps, one fragment of ``fragments`` per averaging; 1 for a method without the options.

    Example::

        >>> wire_share({"wire": "int8", "every": 4})  # (1024 + 4) / 4096 a block, then / 4
        0.062744140625
    """
    numel = 1 << 20
    codec = codec_for(options.get("wire") or "fp32")
    every, fragments = options.get("every") or 1, options.get("fragments") or 1
    return codec.nbytes(numel) / (4 * numel) / every / fragments


def bound_bytes(options: dict[str, Any], params: int) -> float:
    """The bytes of one iteration's average that :func:`dssync.lab.bench.bounds.lower_bound` routes
    by the method's plan (with ``compressed=`` :func:`compressed`): the fp32 model times
    :func:`wire_share`.

    Example::

        >>> bound_bytes({"wire": "int8", "every": 1}, 1 << 20) / 4 / (1 << 20)
        0.2509765625
    """
    return wire_share(options) * 4 * params


def compressed(options: dict[str, Any]) -> bool:
    """Whether a run with ``options`` sends a compressed wire (its global averages then go all
    to all in two stages, :mod:`dssync.comm.transport`)."""
    return (options.get("wire") or "fp32") != "fp32"


class _WhenWarm:
    """Once rank 0 has written its warm-up pace: reads the links' byte counters
    (``bytes_at_warm``) and, with ``events``, starts a Scenario for ``spec.events``."""

    def __init__(self, cluster: Cluster, progress: Path, steps_left: int, events: bool) -> None:
        self.cluster, self.progress, self.steps_left = cluster, progress, steps_left
        self.events = events
        self.bytes_at_warm: dict | None = None
        self.warm_at = float("inf")  # when they were read (time.monotonic, as the ranks time)
        self.scenario: Scenario | None = None
        self.started_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        while not self._stop.wait(0.05):
            if self.progress.is_file():
                try:
                    pace = json.loads(self.progress.read_text())["pace_s"]
                except (ValueError, KeyError):
                    continue
                self.warm_at = time.monotonic()
                self.bytes_at_warm = self.cluster.link_bytes()
                if not self.events:
                    return
                self.started_at = time.monotonic()
                self.scenario = Scenario(
                    self.cluster.set_rate,
                    self.cluster.spec.events,
                    duration_s=pace * self.steps_left,
                ).start()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.scenario is not None:
            self.scenario.stop()

    @property
    def applied(self) -> list[tuple[float, float]]:
        """(monotonic time, new rate) of each change applied."""
        if self.scenario is None:
            return []
        return [(self.started_at + t, step.rate_mbit) for t, step in self.scenario.applied]
