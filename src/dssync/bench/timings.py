"""What the per-rank timings of ``dssync bench`` say: paces after warm-up, the per-step timeline,
and how many steps the pace took to come back after a change of contention.

Each rank's record is ``[start, end, sync seconds]`` per step (monotonic clock).

Example::

    out = summarize(ranks, warmup=3)
    out["iter_time_s"], out["timeline"][5]["iter_s"]
"""

from __future__ import annotations

import statistics
from typing import Any

RECOVERED = 1.25  # back to within 25% of the pre-contention pace


def summarize(ranks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Means per iteration after warm-up, and the per-step timeline (mean over ranks)."""
    paces, syncs = [], []
    for r in ranks:
        rec = r["records"]
        paces.append((rec[-1][1] - rec[warmup][0]) / (len(rec) - warmup))
        syncs.append(statistics.fmean(x[2] for x in rec[warmup:]))
    ends = [
        statistics.fmean(r["records"][i][1] for r in ranks) for i in range(len(ranks[0]["records"]))
    ]
    start = statistics.fmean(r["records"][0][0] for r in ranks)
    timeline = [
        {"step": i, "end": e, "iter_s": e - (ends[i - 1] if i else start)}
        for i, e in enumerate(ends)
    ]
    out = {
        "iter_time_s": statistics.fmean(paces),
        "sync_time_s": statistics.fmean(syncs),
        "slowest_rank_iter_time_s": max(paces),
        "timeline": timeline,
        "switches": ranks[0].get("switches", []),
        "topology": ranks[0].get("topology"),
    }
    return out


def recovery(
    timeline: list[dict[str, Any]], applied: list[tuple[float, float]], warmup: int, repeat: int
) -> dict[str, Any]:
    """Paces before, during and after contention, and how many steps the pace took to come back."""
    if len(applied) < 2:
        return {"recovery_steps": None, "recovery_cycles": None}
    t_on, t_off = applied[0][0], applied[-1][0]
    step_at = lambda t: next((p["step"] for p in timeline if p["end"] >= t), len(timeline))  # noqa: E731
    on, off = step_at(t_on), step_at(t_off)
    iters = [p["iter_s"] for p in timeline]
    pre = statistics.median(iters[warmup:on]) if on > warmup else None
    during = statistics.median(iters[on:off]) if off > on else None
    back = None
    if pre is not None:
        for k in range(off, len(iters) - repeat + 1):
            if statistics.median(iters[k : k + repeat]) <= RECOVERED * pre:
                back = k
                break
    steps = None if back is None else back - off
    return {
        "contention_steps": [on, off],
        "pre_contention_iter_s": pre,
        "contention_iter_s": during,
        "post_contention_iter_s": statistics.median(iters[back:]) if back is not None else None,
        "recovery_steps": steps,
        "recovery_cycles": None if steps is None else steps / repeat,
    }
