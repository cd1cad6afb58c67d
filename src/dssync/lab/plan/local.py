"""N local ranks for real: measured averaging time of `dssync train` against the planner's.

The local ranks share one machine over loopback, so there is no shaped link: the planner's model
for them is one host holding all N ranks (:class:`Net` on a one-host spec), where a message costs
alpha (``LOCAL_FACTOR`` of ``--latency-us``, the planner's loopback latency, an assumption) and
every byte a member sends, receives and sums costs gamma, the CPU's seconds per byte that
:func:`dssync.lab.plan.validate.host_cost` reads from a ``dssync bench-sync --json`` run made here,
with the same N ranks and the model's size, just before the training runs. Then

* ``dssync``: pairs (``Shuffle(2)``) exchange the parameters and floating buffers; no barrier, so
  :func:`schedule_s` follows every rank's clock with the run's measured compute;
* ``bsp``: DDP's one ring all-reduce of the gradients over all N ranks (2(N-1) messages).

What the model leaves out, and a busy 2-core machine shows: with N processes on 2 cores a message
waits until its receiver is scheduled, and a ring of N ranks waits 2(N-1) times in a row; the
skew between ranks' compute (a pair or a ring waits for its last member); and the first step's
set-up. gamma, measured with N ranks running at once, carries some of the scheduling; alpha does
not. Nothing here is fitted to the training runs.

Example::

    >>> p = predict_local(32, params=4938, buffers=128, host_s_per_byte=1e-6, compute_s=0.01)
    >>> sorted(p), p["bsp"] > p["dssync"]
    (['bsp', 'dssync'], True)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from dssync.errors import UsageError
from dssync.lab.cluster.spec import ClusterSpec
from dssync.lab.launch import run_contained
from dssync.lab.plan.cost import BYTES_PER_PARAM, ring_s, schedule_s
from dssync.lab.plan.flows import LOCAL_FACTOR, Net
from dssync.lab.plan.validate import host_cost
from dssync.schedules import Shuffle

METHODS = ("dssync", "bsp")
MIN_BENCH_PARAMS = 1000  # the least `dssync bench-sync --params` takes


def local_spec(world: int) -> ClusterSpec:
    """One host holding ``world`` ranks; its link is never used (ranks of one host share memory)."""
    return ClusterSpec(
        "local", racks=1, hosts_per_rack=1, workers_per_host=world, host_rate_mbit=1e6
    )


def predict_local(
    world: int,
    params: int,
    buffers: int,
    host_s_per_byte: float,
    compute_s: float = 0.0,
    steps: int = 30,
    latency_s: float = 50e-6,
    seed: int = 0,
) -> dict[str, float]:
    """Predicted seconds of averaging per iteration of each of :data:`METHODS` on one host.

    ``params`` and ``buffers`` (floating buffers, which DS-Sync averages too and DDP does not)
    count float32 elements; ``steps`` is the run's length (the clocks are followed over all of it).
    """
    if world < 2:
        raise UsageError(
            f"--measure-local {world}: averaging needs at least 2 ranks; use 2 or more"
        )
    net = Net(local_spec(world), latency_s=latency_s, host_s_per_byte=host_s_per_byte)
    dssync_bytes = BYTES_PER_PARAM * (params + buffers)
    return {
        "dssync": schedule_s(
            net, Shuffle(2, seed=seed), dssync_bytes, compute_s, window=range(0, max(steps, 1))
        ),
        "bsp": ring_s(net, BYTES_PER_PARAM * params),
    }


def model_size(workload: str) -> tuple[int, int]:
    """(parameters, floating buffer elements) of ``workload``'s model."""
    from dssync.lab.workloads import get

    model = get(workload).model()
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    return params, buffers


@dataclass
class LocalRun:
    """Measured and predicted averaging time of N local ranks, per method (seconds per iteration).

    Example::

        run = measure_local(32, steps=30)
        run.error("dssync")  # (predicted - measured) / measured
    """

    world: int
    workload: str
    steps: int
    params: int
    buffers: int
    host_s_per_byte: float
    latency_s: float
    measured: dict[str, dict[str, float]] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    load_average: dict[str, list[float]] = field(default_factory=dict)

    def error(self, method: str) -> float:
        m = self.measured[method]["sync_s"]
        return (self.predicted[method] - m) / max(m, 1e-9)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["error"] = {m: self.error(m) for m in self.predicted}
        return out


def measure_local(
    world: int,
    steps: int = 30,
    workload: str = "digits",
    latency_s: float = 50e-6,
    bench_steps: int = 10,
    timeout_s: float | None = None,
) -> LocalRun:
    """Run bench-sync and `dssync train` (dssync, then bsp) with ``world`` local ranks; predict.

    Each is a contained subprocess (``run_contained``): on ``timeout_s`` (default 120 s plus 30 s
    a rank) its whole process group is killed and a TimeoutError says which command it was.
    """
    params, buffers = model_size(workload)
    timeout = timeout_s or 120.0 + 30.0 * world
    run = LocalRun(world, workload, steps, params, buffers, 0.0, latency_s)
    run.load_average["start"] = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="dssync-local-") as tmp:
        bench_json = Path(tmp) / "bench-sync.json"
        _dssync(
            run,
            timeout,
            "bench-sync",
            "--params",
            str(max(params + buffers, MIN_BENCH_PARAMS)),
            "--workers",
            str(world),
            "--group-size",
            "2",
            "--steps",
            str(bench_steps),
            "--json",
            str(bench_json),
        )
        run.host_s_per_byte = host_cost(json.loads(bench_json.read_text()), world)
        for method in METHODS:
            out = Path(tmp) / f"train-{method}.json"
            _dssync(
                run,
                timeout,
                "train",
                "--workers",
                str(world),
                "--workload",
                workload,
                "--sync",
                method,
                "--max-steps",
                str(steps),
                "--epochs",
                "100000",  # --max-steps ends the run: a few samples a rank make short epochs
                "--quiet",
                "--json",
                str(out),
            )
            summary = json.loads(out.read_text())
            run.measured[method] = {
                "sync_s": float(summary["sync_time_s"]),
                "compute_s": float(summary["compute_time_s"]),
                "iter_s": float(summary["iter_time_s"]),
                "slowest_rank_sync_s": float(max(summary["rank_sync_time_s"])),
                "steps": int(summary["steps"]),
            }
    run.load_average["end"] = list(os.getloadavg())
    for method in METHODS:
        got = predict_local(
            world,
            params,
            buffers,
            run.host_s_per_byte,
            run.measured[method]["compute_s"],
            run.measured[method]["steps"],
            latency_s,
        )
        run.predicted[method] = got[method]
    return run


def _dssync(run: LocalRun, timeout: float, *args: str) -> None:
    """``python -m dssync ARGS`` contained; a failure raises with its stderr's tail."""
    cmd = [sys.executable, "-m", "dssync", *args]
    run.commands.append("dssync " + " ".join(args))
    done = run_contained(cmd, timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"`dssync {' '.join(args)}` exited {done.returncode}; stderr:\n{done.stderr[-3000:]}"
        )


def local_table(run: LocalRun) -> Group:
    """Measured against predicted averaging time per iteration, within 80 columns."""
    la = run.load_average
    head = (
        f"{run.world} local ranks, {run.workload} ({run.params:,} parameters + {run.buffers} "
        f"buffer floats), {run.steps} steps\n"
        f"host model: one host over loopback, alpha {LOCAL_FACTOR * run.latency_s * 1e6:.0f} us "
        f"a message,\ngamma {run.host_s_per_byte * 1e9:.1f} ns a byte (bench-sync, {run.world} "
        "ranks, same model size)"
    )
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("method", "sync meas", "sync pred", "error", "compute", "iteration"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for m in METHODS:
        got = run.measured[m]
        t.add_row(
            m,
            _ms(got["sync_s"]),
            _ms(run.predicted[m]),
            f"{run.error(m):+.0%}",
            _ms(got["compute_s"]),
            _ms(got["iter_s"]),
        )
    foot = (
        f"load average {_load(la.get('start'))} at start, {_load(la.get('end'))} at end\n"
        "left out: waits for a CPU (N processes share the machine's cores), compute\n"
        "skew between ranks, the first step's set-up"
    )
    return Group(Text(head), t, Text(foot))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms" if seconds < 0.01 else f"{seconds * 1000:,.1f} ms"


def _load(avg: list[float] | None) -> str:
    return "?" if not avg else "/".join(f"{x:.1f}" for x in avg)
