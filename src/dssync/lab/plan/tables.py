"""Tables a person reads (80 columns): one cluster's plan, and predictions at 64 to 1,024 workers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich import box
from rich.table import Table

from dssync.lab.cluster.spec import ClusterSpec
from dssync.lab.plan.clusters import cluster_for
from dssync.lab.plan.consensus import consensus_steps, expected_gap
from dssync.lab.plan.cost import Prediction, predict, schedules

SCALES = (64, 256, 1024)
SHORT = {
    "ddp": "ddp",
    "hierarchical": "hier",
    "dssync": "shuffle",
    "dssync-topo": "topo",
    "dssync-topo overlapped": "overlap",
}


@dataclass(frozen=True)
class Plan:
    """A cluster's predictions, with each DS-Sync schedule's mixing figures.

    Example::

        plan = make_plan(cluster_for("s2-inter-rack", 64), params=4_000_000, compute_s=0.05)
        plan.steps["dssync"]   # steps until the disagreement is 1e-3 of its start
    """

    spec: ClusterSpec
    params: int
    compute_s: float
    predictions: list[Prediction]
    gaps: dict[str, float]
    steps: dict[str, float]

    def as_dict(self) -> dict:
        return {
            "topology": self.spec.name,
            "workers": self.spec.world_size,
            "params": self.params,
            "compute_s": self.compute_s,
            "methods": {
                p.method: {"sync_s": p.sync_s, "iter_s": p.iter_s} for p in self.predictions
            },
            "spectral_gap": self.gaps,
            "steps_to_consensus": {
                k: (None if math.isinf(v) else v) for k, v in self.steps.items()
            },
        }


def make_plan(
    spec: ClusterSpec,
    params: int,
    compute_s: float = 0.0,
    latency_s: float = 50e-6,
    eps: float = 1e-3,
) -> Plan:
    """Predictions for ``spec`` and the gap and steps to ``eps`` of each DS-Sync schedule."""
    plans = schedules(spec)
    n = spec.world_size
    return Plan(
        spec,
        params,
        compute_s,
        predict(spec, params, compute_s, latency_s=latency_s, plans=plans),
        gaps={k: expected_gap(s, n) for k, s in plans.items()},
        steps={k: consensus_steps(s, n, eps) for k, s in plans.items()},
    )


def describe(spec: ClusterSpec) -> str:
    """``name, N workers in R racks`` and, on a second line, the shape."""
    return f"{spec.name}, {spec.world_size} workers in {spec.racks} racks\n{shape(spec)}"


def shape(spec: ClusterSpec) -> str:
    """Rack size and link rates, without the number of racks."""
    up = (
        "one switch"
        if not spec.has_core
        else (
            "unshaped core"
            if spec.rack_uplink_mbit is None
            else f"{_rate(spec.rack_uplink_mbit)} uplink"
        )
    )
    slow = ""
    if spec.host_overrides:
        rates = sorted(set(spec.host_overrides.values()))
        slow = f", {len(spec.host_overrides)} at {'/'.join(_rate(r) for r in rates)}"
    per_host = f" x {spec.workers_per_host}" if spec.workers_per_host > 1 else ""
    return f"{spec.hosts_per_rack}{per_host} hosts/rack at {_rate(spec.host_rate_mbit)}{slow}, {up}"


def plan_table(plan: Plan) -> Table:
    """One row per method: sync and iteration time, and the steps to consensus of DS-Sync."""
    t = Table(title=describe(plan.spec), box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("method", "sync", "iteration", "spectral gap", "steps to 1e-3"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for p in plan.predictions:
        base = p.method.split(" ")[0]
        gap = plan.gaps.get(base)
        steps = plan.steps.get(base)
        t.add_row(
            p.method,
            _ms(p.sync_s),
            _ms(p.iter_s),
            "exact" if gap is None else f"{gap:.3g}",
            "exact" if steps is None else _steps(steps),
        )
    return t


def scale_plans(
    name: str,
    params: int,
    compute_s: float,
    scales: tuple[int, ...] = SCALES,
    latency_s: float = 50e-6,
) -> list[Plan]:
    """The plan of topology ``name`` at each worker count of ``scales``, in that order."""
    return [make_plan(cluster_for(name, n), params, compute_s, latency_s) for n in scales]


def scale_table(
    name: str,
    params: int,
    compute_s: float,
    scales: tuple[int, ...] = SCALES,
    latency_s: float = 50e-6,
) -> Table:
    """One row per worker count: iteration time of each method, steps to consensus of DS-Sync."""
    return scale_table_of(scale_plans(name, params, compute_s, scales, latency_s))


def scale_table_of(plans: list[Plan]) -> Table:
    """:func:`scale_table` of plans already made (one topology, one plan per worker count)."""
    first = plans[0].spec
    t = Table(
        title=f"{first.name}: {shape(first)}\nms per iteration, then steps to consensus (1e-3)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
    )
    t.add_column("workers", justify="right")
    for m in SHORT.values():
        t.add_column(m, justify="right")
    t.add_column("shuffle", justify="right")
    t.add_column("topo", justify="right")
    for plan in plans:
        t.add_row(
            str(plan.spec.world_size),
            *[f"{p.iter_s * 1000:,.0f}" for p in plan.predictions],
            _steps(plan.steps["dssync"]),
            _steps(plan.steps["dssync-topo"]),
        )
    return t


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.2f} ms"


def _steps(steps: float) -> str:
    if math.isinf(steps):
        return "never"
    return f"{int(steps):,}" if steps < 1e6 else f"{steps:.1e}"


def _rate(mbit: float) -> str:
    return f"{mbit / 1000:g} Gbit/s" if mbit >= 1000 else f"{mbit:g} Mbit/s"
