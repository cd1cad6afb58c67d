"""Predicted against measured: the planner's figures for the runs of a ``dssync bench --json`` file.

Link rates come from the scenario's own topology file (the rates the emulated cluster shapes its
links to), or with ``rates="probe"`` from the bandwidth probe the bench's dssync-topo run recorded.
The compute time is measured: each method's iteration minus its sync, the median over the
scenario's methods (the flat model's compute does not depend on the method). A scenario with
timed link changes (S4) is predicted as the bench runs it: the changes fire at fractions of a run
planned at the warm-up pace, so the contended stretch lasts a fixed time, not a fixed number of
steps.

Example::

    rows = compare(json.loads(Path("bench.json").read_text()))
    worst = max(rows, key=lambda r: abs(r.iter_error))
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.table import Table

from dssync.errors import UsageError
from dssync.lab.cluster.spec import ClusterSpec, ClusterSpecError, load_cluster
from dssync.lab.plan.cost import predict, topology_of
from dssync.topology import Topology

BENCH_METHODS = ("ddp", "hierarchical", "dssync", "dssync-topo")


@dataclass(frozen=True)
class Row:
    """One (scenario, method): measured and predicted seconds per iteration and of sync.

    Example::

        Row("s2-inter-rack", "ddp", 1.28, 1.21, 1.24, 1.17).iter_error  # -0.055: 5.5% low
    """

    scenario: str
    method: str
    measured_iter: float
    predicted_iter: float
    measured_sync: float
    predicted_sync: float

    @property
    def iter_error(self) -> float:
        return (self.predicted_iter - self.measured_iter) / self.measured_iter

    @property
    def sync_error(self) -> float:
        return (self.predicted_sync - self.measured_sync) / max(self.measured_sync, 1e-9)


def probed_rates(text: str | None) -> dict[str, float | None]:
    """Link rates from a ``Topology.describe()`` line (``host Mbit/s {0:940, ...}, uplink 190``)."""
    if not text:
        return {}
    rates: dict[str, float | None] = {}
    hosts = re.search(r"host Mbit/s \{([^}]*)\}", text)
    for item in hosts.group(1).split(",") if hosts else []:
        if ":" in item:
            h, v = item.split(":")
            rates[f"host:{int(h)}"] = float(v)
    up = re.search(r"uplink ([0-9.]+) Mbit/s", text)
    if up:
        rates["rack_uplink"] = float(up.group(1))
    return rates


def host_cost(rows: Any, world: int) -> float:
    """Seconds per byte a member's CPU spends in a pair's all_reduce, from ``dssync bench-sync --json``.

    The raw all_reduce of a pair on unshaped local links is nearly all host work (copies, TCP on
    loopback, the sum); the row measured with ``world`` ranks (as many as share the CPU in the
    bench) is used, else the largest. A pair's member sends and receives M bytes.
    """
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise UsageError("the host file is not a `dssync bench-sync --json` file; give that file")
    pairs = [r for r in rows if r.get("group_size") == 2 and "raw_s" in r and "numel" in r]
    if not pairs:
        raise UsageError(
            "the host file has no run with --group-size 2; run `dssync bench-sync "
            "--group-size 2 --json FILE`"
        )
    same = [r for r in pairs if r.get("world_size") == world]
    row = same[0] if same else max(pairs, key=lambda r: r.get("world_size", 0))
    return float(row["raw_s"]) / (4 * float(row["numel"]))


def compare(
    data: dict[str, Any],
    rates: str = "file",
    latency_s: float = 50e-6,
    host_s_per_byte: float = 0.0,
) -> list[Row]:
    """One row per (scenario, method) of the bench file ``data``.

    ``host_s_per_byte`` adds the CPU's work per byte (see :func:`host_cost`); 0 leaves it out.
    """
    settings = data.get("settings", {})
    params = int(settings.get("params", 0))
    if params < 1:
        raise UsageError(
            "the bench file has no settings.params; give the file `dssync bench --json` wrote"
        )
    repeat = int(settings.get("repeat", settings.get("period", 8)))  # older runs: "period"
    rows = []
    for scenario, runs in data["results"].items():
        try:
            spec = load_cluster(scenario)
        except ClusterSpecError:
            continue  # a scenario from a file we cannot see: nothing to predict from
        measured = {m: r for m, r in runs.items() if m in BENCH_METHODS}
        if not measured:
            continue
        for m, r in measured.items():
            if not all(isinstance(r.get(k), int | float) for k in ("iter_time_s", "sync_time_s")):
                raise UsageError(
                    f"{scenario} / {m} in the bench file has no iter_time_s and sync_time_s; "
                    "give the file `dssync bench --json` wrote"
                )
        compute = statistics.median(r["iter_time_s"] - r["sync_time_s"] for r in measured.values())
        link = _rates(spec, runs, rates)
        probed = _probed(spec, runs)
        known = topology_of(spec, probed) if probed else None
        for method, r in measured.items():
            sync = _predicted_sync(
                spec,
                method,
                params,
                repeat,
                latency_s,
                link,
                settings,
                compute,
                known,
                host_s_per_byte,
            )
            rows.append(
                Row(scenario, method, r["iter_time_s"], compute + sync, r["sync_time_s"], sync)
            )
    return rows


def _rates(spec: ClusterSpec, runs: dict[str, Any], source: str) -> dict[str, float | None]:
    if source == "file":
        return {}
    if source != "probe":
        raise UsageError(f"rates={source!r} is not known; use 'file' or 'probe'")
    return _probed(spec, runs)


def _probed(spec: ClusterSpec, runs: dict[str, Any]) -> dict[str, float | None]:
    """The rates dssync-topo's probe found, by concrete link name (empty without a probe)."""
    found = probed_rates((runs.get("dssync-topo") or {}).get("topology"))
    up = found.pop("rack_uplink", None)
    if up is not None and spec.has_core:
        found.update({f"rack_uplink:{r}": up for r in range(spec.racks)})
    return found


def _predicted_sync(
    spec: ClusterSpec,
    method: str,
    params: int,
    repeat: int,
    latency_s: float,
    rates: dict[str, float | None],
    settings: dict[str, Any],
    compute: float,
    known: Topology | None,
    host_s_per_byte: float = 0.0,
) -> float:
    warmup = int(settings.get("warmup", 3))
    total = int(settings.get("dynamic_steps" if spec.events else "steps", 30))
    window = range(warmup, max(total, warmup + 1))

    def sync(r: dict[str, float | None], plan_from: Topology | None) -> float:
        got = predict(
            spec,
            params,
            0.0,
            repeat,
            latency_s,
            r,
            plan_from,
            window,
            host_s_per_byte=host_s_per_byte,
            spread=bool(settings.get("spread", False)),  # runs before spreading did not record it
        )
        return next(p.sync_s for p in got if p.method == method)

    base = sync(rates, known)
    if len(spec.events) < 2 or spec.events[0].at_fraction is None:
        return base
    on, off = spec.events[0], spec.events[1]
    contended = {**spec.link_rates(), **rates}
    contended.update({k: on.rate_mbit for k in spec.expand_link(on.link)})
    t0, tc = compute + base, compute + sync(contended, None)  # re-planned for the contention
    steps = total - warmup
    before = on.at_fraction * steps
    during = min((off.at_fraction - on.at_fraction) * steps * t0 / tc, steps - before)
    mean_iter = (before * t0 + during * tc + (steps - before - during) * t0) / steps
    return mean_iter - compute


def validate_table(
    data: dict[str, Any],
    rates: str = "file",
    latency_s: float = 50e-6,
    host_s_per_byte: float = 0.0,
) -> Table:
    """Predicted against measured per scenario and method, with relative errors."""
    rows = compare(data, rates, latency_s, host_s_per_byte)
    if not rows:
        raise UsageError(
            "the bench file has no run of a shipped scenario to predict; "
            "run `dssync bench --json FILE` on s1-s4"
        )
    worst = max(rows, key=lambda r: abs(r.iter_error))
    t = Table(
        title=f"predicted vs measured, {int(data['settings']['params']):,} parameters "
        f"(rates: {rates}"
        + (f", host {host_s_per_byte * 1e9:.2f} ns/byte)" if host_s_per_byte else ")"),
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
        caption=f"worst iteration error: {worst.iter_error:+.0%} ({worst.scenario}, "
        f"{worst.method})",
        caption_justify="left",
    )
    for col in ("scenario", "method", "measured", "predicted", "error", "sync meas", "sync pred"):
        t.add_column(col, justify="left" if col in ("scenario", "method") else "right")
    for r in rows:
        t.add_row(
            r.scenario.split("-")[0],
            r.method,
            _ms(r.measured_iter),
            _ms(r.predicted_iter),
            f"{r.iter_error:+.0%}",
            _ms(r.measured_sync),
            _ms(r.predicted_sync),
        )
    return t


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"
