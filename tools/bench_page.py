"""Write docs/bench.md from the ``dssync bench`` result files in docs/results/bench/ (and the
``dssync bench-sync`` ones in docs/results/bench-sync/).

Each file is the ``--json`` of one ``dssync bench`` run (one scenario, every method in the same
run); it records its command, date and commit, so every figure on the page comes from a file.
``--check`` fails when the page is not what the files give (the tests run it).

    .venv/bin/python tools/bench_page.py            # rewrite the page
    .venv/bin/python tools/bench_page.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dssync.lab.bench.bounds import lower_bound
from dssync.lab.cluster import load_cluster
from dssync.lab.experiments.cluster_bench import bound_bytes, compressed
from dssync.lab.methods import LABEL_SEP, get_method
from dssync.lab.report.summary import fmt

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "bench"
PAGE = ROOT / "docs" / "bench.md"
SYNC = ROOT / "docs" / "results" / "bench-sync"  # `dssync bench-sync` runs (loopback)


def fp32_twin(label: str, methods: dict) -> str | None:
    """The run that differs from ``label`` only by sending fp32 (the label without ``wire=``)."""
    parts = label.split(LABEL_SEP)
    if not any(p.startswith("wire=") for p in parts):
        return None
    twin = LABEL_SEP.join(p for p in parts if not p.startswith("wire="))
    return twin if twin in methods else None


def bound(scenario: str, method: str, r: dict, settings: dict) -> float | None:
    """The method's link-rate bound as :mod:`dssync.lab.bench.bounds` computes it now (a model, not
    a measurement: a result file keeps the one its run computed, ``lower_bound_s``), for the
    algorithm the run used: a run whose settings do not say ``"encoded": "two-stage"`` gathered
    whole compressed messages in a global average, k/2 times the bytes of a ring."""
    spec = load_cluster(scenario)
    options = r.get("options") or {}
    nbytes = bound_bytes(options, settings["params"])
    packed = compressed(options)
    if packed and settings.get("encoded") != "two-stage" and _global(method):
        nbytes *= spec.world_size / 2  # k compressed buffers gathered: k/2 of a ring's bytes
        packed = False
    return lower_bound(spec, method, nbytes, settings.get("repeat", 8), compressed=packed)


def _global(method: str) -> bool:
    return get_method(method).options.get("plan") == "global"


def table(methods: dict[str, dict], bounds: dict[str, float | None] | None = None) -> list[str]:
    lines = [
        "| method | iteration, ms | vs DDP | MB per iteration, busiest link | bytes vs fp32 "
        "| link-rate bound, ms | vs bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in methods.items():
        twin = fp32_twin(name, methods)
        share = (
            f"{r['max_link_bytes_per_iter'] / methods[twin]['max_link_bytes_per_iter']:.2f}"
            if twin
            else ""
        )
        bound = (bounds or {}).get(name, r.get("lower_bound_s"))
        over = r["iter_time_s"] / bound if bound else None
        lines.append(
            f"| {name} | {fmt(r['iter_time_s'], '.0f', 1000)} | {_x(r.get('ratio_to_ddp'))} "
            f"| {r['max_link_bytes_per_iter'] / 1e6:.1f} | {share} "
            f"| {fmt(bound, '.0f', 1000) if bound else ''} | {_x(over) if over else ''} |"
        )
    return lines


def _x(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _counted(methods: dict) -> str:
    """What the bytes of a run's table cover: from the end of the warm-up, where every run
    says so (``bytes_counted_from``), else the whole run (files before it was recorded)."""
    if methods and all(r.get("bytes_counted_from") == "warm-up" for r in methods.values()):
        return ", nor in the bytes (counted from rank 0's end of the warm-up)"
    return ""


def section(name: str, run: dict) -> list[str]:
    meta, s = run.get("meta", {}), run["settings"]
    lines = []
    for scenario, methods in run["results"].items():
        workers = max((len(r.get("rank_hosts") or []) for r in methods.values()), default=0)
        lines += [
            f"## {(meta.get('title') if len(run['results']) == 1 else None) or scenario}",
            "",
            f"{s['params'] / 1e6:g}M parameters (fp32), {workers or '?'} workers; {s['steps']} "
            f"steps, the first {s['warmup']} not counted{_counted(methods)}. Run "
            f"{meta.get('date', '?')} at commit {meta.get('commit') or '?'}:",
            "",
            f"    {meta.get('command', '?')}",
            "",
            *table(methods, {m: bound(scenario, m, r, s) for m, r in methods.items()}),
            "",
        ]
        failed = run.get("failed", {}).get(scenario, {})
        if failed:
            lines += [f"- {m} failed: {why.splitlines()[0]}" for m, why in failed.items()]
            lines.append("")
    if (RESULTS / f"{name}.png").is_file():
        lines += [f"![{name}](results/bench/{name}.png)", ""]
    return lines


def sync_cost(name: str, run: dict) -> list[str]:
    """One ``dssync bench-sync`` run (its JSON under ``meta`` and ``results``): a DS-Sync step
    against a raw exchange of the same buffer with the partner, per size and wire."""
    meta = run.get("meta", {})
    lines = [
        f"## One averaging step on loopback ({name})",
        "",
        f"Run {meta.get('date', '?')} at commit {meta.get('commit') or '?'}"
        + (f"; {meta['note']}" if meta.get("note") else "")
        + ":",
        "",
        f"    {meta.get('command', '?')}",
        "",
        "| parameters | workers | wire | DS-Sync step, ms | raw exchange, ms "
        "| step / exchange (quartiles over the steps) "
        "| encode, ms | step / fp32 exchange |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in run["results"]:
        lines.append(
            f"| {r['numel']:,} | {r['world_size']} | {r['wire']} | {r['dssync_s'] * 1000:.1f} "
            f"| {r['raw_exchange_s'] * 1000:.1f} | {r['overhead_vs_raw_exchange']:.2f}x{_iqr(r)} "
            f"| {r['encode_s'] * 1000:.1f} | {r['overhead_vs_fp32_exchange']:.2f}x |"
        )
    return [*lines, ""]


def _iqr(r: dict) -> str:
    """The per-step ratio's quartiles, where the run recorded them."""
    if "exchange_q1" not in r:
        return ""
    return f" ({r['exchange_q1']:.2f}-{r['exchange_q3']:.2f})"


def page(found: dict[str, dict], costs: dict[str, dict] | None = None) -> str:
    lines = [
        "# Cost per iteration",
        "",
        "Generated by `tools/bench_page.py` from the result files in `docs/results/bench/`; do "
        "not edit by hand. Each table is one `dssync bench` run on the emulated cluster: every "
        "method trains the same flat model with no compute of its own, so an iteration is its "
        "synchronization. *MB per iteration* is what crossed the busiest link (read from the "
        "links' byte counters), *bytes vs fp32* the same over the run that differs only by "
        "sending fp32, and the *link-rate bound* the time the links' rates allow the method's "
        "plan at best, as `dssync.lab.bench.bounds` computes it (blank where it is not worked out). The byte counters cover the whole run "
        "unless a table says they count from the end of the warm-up; over the whole run the "
        "topology-aware presets' rows include their start-up link probe, a fixed share that "
        "neither the bound nor the wire format changes. Time to a target accuracy, which also "
        "counts what local steps and compression cost in accuracy, is in "
        "[Time to train](time-to-train.md).",
        "",
    ]
    for name, run in found.items():
        lines += section(name, run)
    for name, run in (costs or {}).items():
        lines += sync_cost(name, run)
    return "\n".join(lines)


def results(where: Path = RESULTS) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(where.glob("*.json"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the page is stale")
    a = ap.parse_args(argv)
    want = page(results(), results(SYNC))
    if a.check:
        if not PAGE.is_file() or PAGE.read_text() != want:
            print("stale: docs/bench.md; run python tools/bench_page.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
