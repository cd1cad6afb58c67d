"""What the per-rank timings of ``dssync bench`` say: paces after warm-up, the tail (p99 and worst
iteration), the per-step timeline, and how many steps each change of contention took to settle.

Each rank's record is ``[start, end, sync seconds]`` per step (monotonic clock).

Recovery, as the bench table prints it: for each change of contention (it starts, it ends), the
number of steps from the step the change fell in until the iteration time is back within
``SETTLED_WITHIN`` (20%) of the settled value of that phase. Iteration times are taken over a
window of one schedule cycle (``repeat`` steps: a shuffled schedule's steps differ by design, its
cycles do not), and the settled value is the median of those windows over the second half of the
phase. A single stall inside a window lifts its mean, so a 30-second step in a 0.5-second pace is
counted until the window has moved past it (a median window would hide it).

Example::

    out = summarize(ranks, warmup=3)
    out["iter_time_s"], out["p99_iter_s"], out["worst_iter_s"], out["timeline"][5]["iter_s"]
"""

from __future__ import annotations

import math
import statistics
from typing import Any

SETTLED_WITHIN = 0.20  # back within 20% of the phase's settled iteration time


def summarize(ranks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Means per iteration after warm-up, the tail, and the per-step timeline (mean over ranks).

    The tail is over steps after warm-up, each step's time being its slowest rank's (end minus
    start of that rank's step): ``p99_iter_s`` (nearest rank) and ``worst_iter_s``.
    """
    paces, syncs = [], []
    for r in ranks:
        rec = r["records"]
        paces.append((rec[-1][1] - rec[warmup][0]) / (len(rec) - warmup))
        syncs.append(statistics.fmean(x[2] for x in rec[warmup:]))
    steps = len(ranks[0]["records"])
    slowest = [max(r["records"][i][1] - r["records"][i][0] for r in ranks) for i in range(steps)]
    ends = [statistics.fmean(r["records"][i][1] for r in ranks) for i in range(steps)]
    start = statistics.fmean(r["records"][0][0] for r in ranks)
    timeline = [
        {"step": i, "end": e, "iter_s": e - (ends[i - 1] if i else start)}
        for i, e in enumerate(ends)
    ]
    tail = slowest[warmup:]
    return {
        "iter_time_s": statistics.fmean(paces),
        "sync_time_s": statistics.fmean(syncs),
        "slowest_rank_iter_time_s": max(paces),
        "p99_iter_s": percentile(tail, 0.99),
        "worst_iter_s": max(tail),
        "timeline": timeline,
        "switches": ranks[0].get("switches", []),
        "topology": ranks[0].get("topology"),
    }


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``: a value that occurred."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def settle(iters: list[float], window: int) -> tuple[float | None, int | None]:
    """Settled time of one phase and the steps from its start until a window is within 20% of it.

    Returns ``(settled, steps)``; ``steps`` is None if no window gets within 20%, and both are
    None for a phase shorter than one window.
    """
    w = max(1, min(window, len(iters) // 2))
    means = [statistics.fmean(iters[k : k + w]) for k in range(len(iters) - w + 1)]
    if len(iters) < 2 or not means:
        return None, None
    settled = statistics.median(means[len(means) // 2 :])
    back = next(
        (k for k, m in enumerate(means) if abs(m - settled) <= SETTLED_WITHIN * settled), None
    )
    return settled, back


def recovery(
    timeline: list[dict[str, Any]], applied: list[tuple[float, float]], warmup: int, repeat: int
) -> dict[str, Any]:
    """Settled paces before, during and after contention, and the steps each change took to settle.

    ``applied`` holds (monotonic time, new rate) of each change; the first starts the contention
    and the last ends it. ``recovery_steps`` is ``[at start, at end]`` (None: never settled).
    """
    if len(applied) < 2:
        return {"recovery_steps": None}
    t_on, t_off = applied[0][0], applied[-1][0]
    step_at = lambda t: next((p["step"] for p in timeline if p["end"] >= t), len(timeline))  # noqa: E731
    on, off = step_at(t_on), step_at(t_off)
    iters = [p["iter_s"] for p in timeline]
    pre, _ = settle(iters[warmup:on], repeat)
    during, at_on = settle(iters[on:off], repeat)
    after, at_off = settle(iters[off:], repeat)
    return {
        "contention_steps": [on, off],
        "pre_contention_iter_s": pre,
        "contention_iter_s": during,
        "post_contention_iter_s": after,
        "recovery_steps": [at_on, at_off],
    }
