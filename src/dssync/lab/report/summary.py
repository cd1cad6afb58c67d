"""Time to train, as MLPerf Training measures it: how long each method takes to reach a fixed target.

The target is a quality every method must reach (the workload declares one that BSP reaches well
before the end of its default run; ``--target`` overrides it), never a figure taken from one of
the runs being compared: a method's own final value is reached near its last evaluation by
construction, and a noisier curve crosses it early by chance. Each method runs several seeds;
per method the report gives the median and the range of the time and of the steps to the
target over the seeds that reached it, how many did, and the final metric. Time is training
time on the slowest rank, evaluations excluded.

Two methods differ beyond the spread when their ranges of time to target do not overlap, a seed
that never reached the target counting as infinitely slow. With 5 seeds each, two methods
drawn from one distribution are separated so by chance in 2 of 252 orderings (0.8%); with 3
seeds, in 2 of 20 (10%), so 3-seed verdicts are a first look.

A target must need synchronization: the ``solo`` method (no averaging while training; each
evaluation scores the average of the workers' models, which are averaged only at the end) is
the control, and the verdicts say so when it reaches the target.

Example::

    summary = summarize(runs, target=0.85, reference="bsp")
    summary["methods"]["dssync"]["time_to_target"]   # {"median": ..., "min": ..., "max": ...}
    summary["verdicts"]                              # one line per method against the reference
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from rich.table import Table

from dssync.lab.methods import OPTIONS
from dssync.lab.report.tables import compact_table

# The method that never averages while training: a target it reaches does not discriminate.
CONTROL = "solo"


def reach(
    evals: list[dict[str, Any]], metric: str, target: float, higher_is_better: bool
) -> dict[str, float] | None:
    """``{"time_s", "step", "averaged_time_s"}`` of the first evaluation at or past ``target``
    (None if none was); ``averaged_time_s`` is None in results written before it was recorded."""
    for e in evals:
        value = e.get(metric)
        if value is None:
            continue
        if (value >= target) if higher_is_better else (value <= target):
            averaged = e.get("averaged_time_s")
            return {
                "time_s": float(e["time_s"]),
                "step": int(e["step"]),
                "averaged_time_s": None if averaged is None else float(averaged),
            }
    return None


def time_to_target(
    evals: list[dict[str, Any]], metric: str, target: float, higher_is_better: bool
) -> float | None:
    """Training seconds until the averaged model first reached ``target`` (None if it never did)."""
    hit = reach(evals, metric, target, higher_is_better)
    return None if hit is None else hit["time_s"]


def spread(values: list[float | None]) -> dict[str, float] | None:
    """Median, min and max of the values that are not None (None when there are none)."""
    vs = [v for v in values if v is not None]
    if not vs:
        return None
    return {"median": statistics.median(vs), "min": min(vs), "max": max(vs)}


def _mean(values: list[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.fmean(vs) if vs else None


def _std(values: list[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.stdev(vs) if len(vs) > 1 else (0.0 if vs else None)


def method_summary(
    runs: list[dict[str, Any]], target: float | None, failed: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One method's runs (one per seed) -> the figures of the comparison table.

    ``failed`` lists the seeds whose run ended in an error (``{"seed", "error"}``): each counts
    as a seed that never reached the target; the other figures are over the runs that ended.
    """
    failed = failed or []
    if not runs:
        return _all_failed(failed, target)
    first = runs[0]
    metric, higher = first["metric_name"], first["higher_is_better"]
    finals = [r["final_metric"] for r in runs]
    hits = [reach(r["evals"], metric, target, higher) if target is not None else None for r in runs]
    hits += [None] * len(failed)
    times = [h["time_s"] if h else None for h in hits]
    return {
        "metric_name": metric,
        "higher_is_better": higher,
        "seeds": [r["config"]["seed"] for r in runs] + [f["seed"] for f in failed],
        "failed": failed,
        # The DS-Sync options the runs used (the preset's, or as given: --every, --outer, ...).
        "options": {k: first["config"].get(k) for k in (*OPTIONS, "outer_lr")},
        "target": target,
        # Per seed, in seed order; None where that seed never reached the target.
        "times_to_target_s": times,
        "steps_to_target": [h["step"] if h else None for h in hits],
        "time_to_target": spread(times),
        # The same with the global average that makes the evaluated model (eval_record's
        # averaged_time_s): what a run stopped at the target pays for its model.
        "times_with_average_s": [h["averaged_time_s"] if h else None for h in hits],
        "time_with_average": spread([h["averaged_time_s"] if h else None for h in hits]),
        "steps_to_target_spread": spread([h["step"] if h else None for h in hits]),
        "seeds_reaching_target": sum(h is not None for h in hits),
        "final_metric": statistics.median(finals),
        "final_metric_range": [min(finals), max(finals)],
        "final_metric_mean": _mean(finals),
        "final_metric_std": _std(finals),
        "final_metrics": finals,
        "swa_metric": _mean([r.get("swa_metric") for r in runs]),
        "iterations_per_s": _mean(
            [r["steps"] / r["train_time_s"] for r in runs if r["train_time_s"] > 0]
        ),
        "iter_time_s": statistics.median([r["iter_time_s"] for r in runs]),
        "iter_times_s": [r["iter_time_s"] for r in runs],
        "compute_time_s": statistics.median([r.get("compute_time_s", 0.0) for r in runs]),
        "sync_time_s": statistics.median([r["sync_time_s"] for r in runs]),
        "consensus_distance": _mean([r["consensus_distance"] for r in runs]),
        "train_time_s": _mean([r["train_time_s"] for r in runs]),
        "threads": sorted({t for r in runs for t in r.get("rank_threads") or []}),
        # What --sync auto chose on each seed (empty for other methods).
        "auto": [picked(r["auto"]) for r in runs if "auto" in r],
        # Where each seed's groups came from: the topology planned from (probed rates), the
        # starting schedule and its re-plans ([averaging, schedule]); None without a plan.
        "plans": [r.get("plan") for r in runs],
    }


def picked(auto: dict[str, Any]) -> str:
    """What ``--sync auto`` ran, as a label: ``dssync-topo-local:every=16:outer=nesterov``
    (the outer step named where it is not the method's own; ``:group-size=4`` where it picked
    the group size, ``:wire=int8`` where it sends less than fp32)."""
    from dssync.lab.methods import get_method

    every, outer, size = auto.get("every"), auto.get("outer"), auto.get("group_size")
    wire = auto.get("wire")
    own = get_method(auto["method"]).options.get("outer", "none")
    return (
        auto["method"]
        + (f":every={every}" if every else "")
        + (f":outer={outer}" if outer and outer != own else "")
        + (f":group-size={size}" if size and auto["method"].startswith("dssync") else "")
        + (f":wire={wire}" if wire and wire != "fp32" else "")
    )


def _all_failed(failed: list[dict[str, Any]], target: float | None) -> dict[str, Any]:
    """The entry of a method none of whose runs ended: no figures, only the failures."""
    n = len(failed)
    return {
        "metric_name": None,
        "higher_is_better": True,
        "seeds": [f["seed"] for f in failed],
        "failed": failed,
        "options": {},
        "target": target,
        "times_to_target_s": [None] * n,
        "steps_to_target": [None] * n,
        "time_to_target": None,
        "times_with_average_s": [None] * n,
        "time_with_average": None,
        "steps_to_target_spread": None,
        "seeds_reaching_target": 0,
        "final_metric": None,
        "final_metric_range": [None, None],
        "final_metrics": [],
        "iter_time_s": None,
        "compute_time_s": None,
        "sync_time_s": None,
        "auto": [],
        "plans": [],
    }


def fmt(value: float | None, spec: str = ".4f", scale: float = 1.0) -> str:
    """``value * scale`` formatted with ``spec``, or "n/a" (a method whose every run failed)."""
    return "n/a" if value is None else format(value * scale, spec)


def _interval(m: dict[str, Any]) -> tuple[float, float]:
    """(min, max) of a method's time to target; a seed that never reached it counts as inf."""
    reached = [t for t in m["times_to_target_s"] if t is not None]
    if not reached:
        return math.inf, math.inf
    high = math.inf if len(reached) < len(m["times_to_target_s"]) else max(reached)
    return min(reached), high


# A race whose median time to the target is under this is too short for a verdict: start-up,
# timer resolution and a busy machine's hiccups are a large share of it.
SHORTEST_S = 1.0
# Per-iteration times of one method whose slowest seed took more than this many times its
# fastest: the machine was shared or throttled, and a ranking of such runs is noise.
NOISIEST = 2.0


def unjudged(m: dict[str, Any], ref: dict[str, Any]) -> str | None:
    """Why the race of ``m`` against ``ref`` cannot give a verdict (too short or too noisy), or
    None when it can."""
    short = [
        f"{x['time_to_target']['median']:.2f} s"
        for x in (m, ref)
        if x["time_to_target"]["median"] < SHORTEST_S
    ]
    if short:
        return (
            f"too short for a verdict ({' and '.join(short)} to the target, under "
            f"{SHORTEST_S:g} s; raise --target or use a larger workload)"
        )
    for x in (m, ref):
        times = [t for t in x.get("iter_times_s") or [] if t]
        if len(times) > 1 and max(times) > NOISIEST * min(times):
            return (
                f"too noisy for a verdict (per-iteration times over the seeds "
                f"{min(times) * 1000:.1f}-{max(times) * 1000:.1f} ms, more than "
                f"{NOISIEST:g}x apart; was the machine busy?)"
            )
    return None


def compare_pair(a: dict[str, Any], b: dict[str, Any]) -> str:
    """ "faster", "slower" or "within the spread": ``a``'s time to target against ``b``'s."""
    (a_lo, a_hi), (b_lo, b_hi) = _interval(a), _interval(b)
    if a_hi < b_lo:
        return "faster"
    if b_hi < a_lo:
        return "slower"
    return "within the spread"


def verdicts(methods: dict[str, dict[str, Any]], reference: str) -> list[str]:
    """One plain line per method: its median against the reference's, and whether the
    difference is larger than the spread of the seeds; first, when the :data:`CONTROL` ran and
    reached the target, that the target does not need synchronization."""
    ref = methods.get(reference)
    lines = []
    control = methods.get(CONTROL)
    if control is not None and control["seeds_reaching_target"]:
        lines.append(
            f"the target does not need synchronization: {CONTROL} (no averaging while training) "
            f"reached it on {control['seeds_reaching_target']} of {len(control['seeds'])} seeds, "
            "so this table ranks iteration speed only; raise --target or train longer "
            "(--epochs) until it fails"
        )
    for name, m in methods.items():
        n, k = len(m["seeds"]), m["seeds_reaching_target"]
        broke = m.get("failed") or []
        if broke:
            seeds = ", ".join(str(f["seed"]) for f in broke)
            lines.append(f"{name}: the run of seed {seeds} failed: {broke[0]['error']}")
        if k == 0:
            lines.append(f"{name}: no seed reached the target")
            continue
        med = m["time_to_target"]["median"]
        missed = f" ({n - k} of {n} seeds never reached it)" if k < n else ""
        if ref is None or name == reference or ref["time_to_target"] is None:
            lines.append(f"{name}: {med:.1f} s to the target (median){missed}")
            continue
        ratio = med / ref["time_to_target"]["median"]
        how = compare_pair(m, ref)
        tail = (
            f"{how} than {reference} beyond the spread of the seeds"
            if how != "within the spread"
            else f"within the spread of {reference}'s seeds (ranges overlap)"
        )
        tail = unjudged(m, ref) or tail
        lines.append(
            f"{name}: {ratio:.2f}x {reference}'s median time to the target, {tail}{missed}"
        )
    reached = {n: m for n, m in methods.items() if m["time_to_target"] is not None}
    if reached:
        best = min(reached, key=lambda n: reached[n]["time_to_target"]["median"])
        ties = [
            n for n in reached if n != best and compare_pair(reached[n], reached[best]) != "slower"
        ]
        doubt = [n for n in reached if n != best and unjudged(reached[n], reached[best])]
        if doubt:
            lines.append(
                f"fastest median: {best}; no verdict: {unjudged(reached[doubt[0]], reached[best])}"
            )
        elif ties:
            lines.append(f"fastest median: {best}; not separated from it: {', '.join(ties)}")
        else:
            lines.append(f"fastest: {best}, beyond the spread of every other method")
    return lines


def summarize(
    runs: dict[str, list[dict[str, Any]]],
    target: float | None,
    reference: str = "bsp",
    source: str = "given",
    failed: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Per-method figures against a fixed ``target`` (None: no time to target is reported);
    ``failed`` holds each method's runs that ended in an error (they never reached it)."""
    failed = failed or {}
    methods = {m: method_summary(rs, target, failed.get(m)) for m, rs in runs.items()}
    return {
        "target": target,
        "target_source": source if target is not None else "none declared; pass --target",
        "reference": reference,
        "methods": methods,
        "verdicts": verdicts(methods, reference) if target is not None else [],
    }


def _range(s: dict[str, float] | None, fmt: str = "{:.1f}") -> str:
    if s is None:
        return "n/a"
    lo, hi = fmt.format(s["min"]), fmt.format(s["max"])
    return f"{fmt.format(s['median'])} ({lo}-{hi})"


def _median(s: dict[str, float] | None) -> str:
    return "n/a" if s is None else f"{s['median']:.0f}"


def summary_table(summary: dict[str, Any]) -> Table:
    """The comparison as a terminal table (80 columns): one row per method, what `dssync compare`
    prints. Time to target in training seconds of the slowest rank; median (range) over seeds."""
    target = summary["target"]
    title = "no target" if target is None else f"target {target:.4g} ({summary['target_source']})"
    t = compact_table(
        title,
        ["method", "reached", "time to target\ns: median (range)", "steps", "final", "ms/it"],
    )
    for name, m in summary["methods"].items():
        t.add_row(
            name,
            f"{m['seeds_reaching_target']}/{len(m['seeds'])}",
            _range(m["time_to_target"]),
            _median(m["steps_to_target_spread"]),
            fmt(m["final_metric"]),
            fmt(m["iter_time_s"], ".0f", 1000),
        )
    return t
