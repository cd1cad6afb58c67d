"""Goodput of the elastic methods: the same job with and without a replica killed every ~30 s.

Each run is ``run_elastic`` (what ``dssync train --elastic`` runs) on this machine: a Lighthouse
and ``--replicas`` replica processes of a tiny workload, a fixed number of steps; with failures,
the launcher's punisher (``Chaos``, ``--chaos-every``) SIGKILLs a random replica about every
``--chaos-every`` seconds (20% either way) and it is restarted after ``--restart-delay``. Runs are
interleaved (seed by seed, method by method, with and without failures alternating which goes
first) so a shared machine's load falls on both sides alike.

Per run, from the replicas' step records (``steps.jsonl``):
- job time: from the first step any replica took to the first replica's last step (in the first
  result file, goodput-digits-4.json: from the start signal, the first quorum's forming included);
- samples/s of the whole job: every step any replica process took (lost work included) times
  the batch size, over the job time;
- time to target: from the start to the first evaluation (each replica's own model, each epoch
  of its shard) that reached ``--target``; every evaluation is kept in the result file;
- live heals (elastic DS-Sync only): heals of a process that had averaged before, a live replica
  left out of a quorum (its heartbeats late) and healed back; and how many step records saw a
  quorum of each size.
goodput = samples/s under failures / samples/s without, paired by method and seed.
With ``--cluster SPEC`` (root) the race runs on an emulated cluster built once for it: the
Lighthouse on host 0, replica ``n`` on host ``n`` mod the hosts (its namespace, its shaped link).
``dssync-restarts`` (``@K``: averaging every K steps) is DS-Sync without torchft, under torchrun
``--max-restarts`` from checkpoints every ``--checkpoint-every`` steps (tools/goodput_restarts.py
says how its record is read).

    PYTHONPATH=src .venv/bin/python tools/goodput_elastic.py --replicas 4 --seeds 0,1 \\
        --out docs/results/elastic/goodput-digits-4.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import goodput_restarts

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("elastic-dssync", "torchft-diloco", "torchft-local-sgd")
RESTARTS = "dssync-restarts"  # DS-Sync under torchrun --max-restarts: tools/goodput_restarts.py
# torchft's DiLoCo at the method's preset (every 4, outer lr 0.7) diverged on digits after 200-300
# steps (accuracy 0.9 then 0.1, at batch 8 and 16); at the lab's diloco preset (every 16, outer lr
# 0.5) it trains (0.978 after 1,500 steps on 2 replicas). The others keep their presets.
SETTINGS = {"torchft-diloco": {"every": 16, "outer_lr": 0.5}}


def settings_of(label: str) -> tuple[str, dict]:
    """``"elastic-dssync@4"``: the method and its settings, averaging every 4 steps (a
    `` hb=MS`` suffix, the Lighthouse's heartbeat timeout, is read by :func:`heartbeat_of`)."""
    method, _, every = label.split(" ")[0].partition("@")
    settings = dict(SETTINGS.get(method, {}))
    if every:
        settings["every"] = int(every)
    return method, settings


def heartbeat_of(label: str) -> int | None:
    """``"elastic-dssync hb=500"``: 500 (ms); None: the launcher's default."""
    hb = [w for w in label.split(" ") if w.startswith("hb=")]
    return int(hb[0][3:]) if hb else None


def stalls(steps: list[dict], kills: list[dict], window_s: float = 30.0) -> list[float]:
    """Per kill, the survivors' median longest wait between two steps of theirs in the
    ``window_s`` after it (the wait that spans the kill included): what a kill cost the others."""
    out = []
    for k in kills:
        longest = []
        for n in {r["replica"] for r in steps} - {k["replica"]}:
            times = sorted(r["time"] for r in steps if r["replica"] == n)
            near = [t for t in times if k["time"] - 5 <= t <= k["time"] + window_s]
            gaps = [b - a for a, b in zip(near, near[1:], strict=False)]
            if gaps:
                longest.append(max(gaps))
        if longest:
            out.append(round(statistics.median(longest), 3))
    return out


def live_heals(steps: list[dict]) -> int | None:
    """Heals of a process that had averaged before: a live replica the Lighthouse left out of a
    quorum (its heartbeats late) and healed back; None when the method does not record heals.
    A record says ``healed`` only at a step that averaged (None between averagings)."""
    if not any(r.get("healed") is not None for r in steps):
        return None
    averaged: set[int] = set()
    n = 0
    for r in steps:
        if r.get("healed") is None:
            continue
        n += r["healed"] and r["pid"] in averaged
        averaged.add(r["pid"])
    return n


def quorum_sizes(steps: list[dict]) -> dict[str, int]:
    """How many step records saw a quorum of each size."""
    sizes = Counter(len(r["members"]) for r in steps if r.get("members") is not None)
    return {str(k): v for k, v in sorted(sizes.items())}


def one_run(
    label: str, seed: int, chaos_every: float | None, a: argparse.Namespace, hosts=None
) -> dict:
    """One run of ``label``; ``hosts`` (a :class:`~dssync.lab.elastic.launch.Hosts`) places the
    replicas on an emulated cluster's hosts (default: this machine)."""
    if label.startswith(RESTARTS):
        return goodput_restarts.one_run(label, seed, chaos_every, a)
    from dssync.lab.config import TrainConfig
    from dssync.lab.elastic.launch import Chaos, run_elastic, step_records
    from dssync.lab.methods import configure

    method, settings = settings_of(label)
    cfg = TrainConfig(
        workload=a.workload, sync=method, epochs=10_000, batch_size=a.batch_size,
        max_steps=a.steps, timeout_s=a.timeout_s, seed=seed, **settings,
    )  # fmt: skip
    cfg.progress = False
    cfg = configure(cfg)
    chaos = None if chaos_every is None else Chaos(every_s=chaos_every, seed=seed)
    hb = heartbeat_of(label)
    beat = {} if hb is None else {"heartbeat_ms": hb}
    with tempfile.TemporaryDirectory(prefix="goodput-") as tmp:
        folder = Path(tmp)
        summary = run_elastic(
            cfg, a.replicas, min_replicas=a.replicas // 2 + 1, restart_delay_s=a.restart_delay,
            folder=folder, say=lambda line: print(f"    {line}", flush=True), chaos=chaos,
            timeout_s=a.budget, hosts=hosts, **beat,
        )  # fmt: skip
        go = (folder / "go").stat().st_mtime
        rs = step_records(folder)
    steps = [r for r in rs if "step" in r]
    # the job's clock starts at its first step: the first quorum's forming (20 s once here, on a
    # loaded machine) is no failure's cost, and the punisher starts once every replica stepped
    start = min(r["time"] for r in steps)
    end = min(r["time"] for r in steps if r["step"] == a.steps)
    done = [r for r in steps if r["time"] <= end]
    curve = sorted((r["time"] - start, r["metric"]) for r in rs if "eval_step" in r)
    reached = [t for t, metric in curve if metric >= a.target]
    e = summary["elastic"]
    return {
        "method": label,
        "seed": seed,
        "chaos_every_s": chaos_every,
        "kills": len(e["chaos_kills"]),
        "stalls_s": stalls(steps, e["chaos_kills"]),
        "restarts": sum(e["restarts"].values()),
        "live_heals": live_heals(steps),
        "quorum_sizes": quorum_sizes(steps),
        "finished": len(e["finished"]),
        "job_s": end - start,
        "first_step_after_go_s": start - go,
        "samples": len(done) * a.batch_size,
        "samples_per_s": len(done) * a.batch_size / (end - start),
        "time_to_target_s": min(reached) if reached else None,
        "final_metric": summary["final_metric"],
        "one_model": len(set(e["final_model_sha256"].values())) == 1,
        "evals": [[round(t, 2), round(m, 4)] for t, m in curve],  # (s from the start, metric)
    }


def heals(r: dict) -> str:
    """The live heals of a run (:func:`live_heals`), ``-`` where not recorded."""
    return "-" if r.get("live_heals") is None else str(r["live_heals"])


def table(pairs: list[dict], target: float) -> str:
    """One row per pair; the live heals' column only where a run recorded them (result files
    from before 2026-12-07's twenty-third session did not)."""
    counted = any(
        p[side].get("live_heals") is not None for p in pairs for side in ("calm", "chaos")
    )
    head = (
        "| method | seed | kills | job s (no faults / faults) | samples/s (no faults / faults) "
        f"| goodput | time to {target} s (no faults / faults) | final metric (no faults / faults) "
        "| survivors' stall per kill s |"
    ) + (" live replicas healed (no faults / faults) |" if counted else "")
    out = [head, "|" + "---|" * (10 if counted else 9)]
    for p in pairs:
        c, f = p["calm"], p["chaos"]

        def ttt(r: dict) -> str:
            if r["method"].startswith(RESTARTS):
                return "-"  # not measured (goodput_restarts.py)
            return (
                "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
            )

        out.append(
            f"| {p['method']} | {p['seed']} | {f['kills']} | {c['job_s']:.0f} / {f['job_s']:.0f} "
            f"| {c['samples_per_s']:.0f} / {f['samples_per_s']:.0f} | {p['goodput']:.2f} "
            f"| {ttt(c)} / {ttt(f)} | {c['final_metric']:.4f} / {f['final_metric']:.4f} "
            f"| {' '.join(f'{x:.1f}' for x in f.get('stalls_s', [])) or '-'} |"
            + (f" {heals(c)} / {heals(f)} |" if counted else "")
        )
    return "\n".join(out)


def render(result: dict) -> str:
    """The docs' tables from a result file: goodput per method (median, range), then each pair."""
    out = ["| method | goodput, median (range) | pairs |", "|---|---|---|"]
    for m, g in result["summary"].items():
        n = sum(p["method"] == m for p in result["pairs"])
        out.append(
            f"| {m} | {g['goodput_median']:.2f} ({g['goodput_min']:.2f}-{g['goodput_max']:.2f}) "
            f"| {n} |"
        )
    return "\n".join(out) + "\n\n" + table(result["pairs"], result["settings"]["target"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--render", metavar="RESULT", help="print the tables of a result file; run nothing"
    )
    ap.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated; METHOD@K averages (or syncs) every K steps",
    )
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--workload", default="digits")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--chaos-every", type=float, default=30.0)
    ap.add_argument("--restart-delay", type=float, default=2.0)
    ap.add_argument("--timeout-s", type=float, default=20.0)
    ap.add_argument(
        "--heartbeat-ms",
        help="comma-separated Lighthouse heartbeat timeouts, each method run at each "
        "(default: the launcher's)",
    )
    ap.add_argument("--target", type=float, default=0.975)
    ap.add_argument(
        "--checkpoint-every", type=int, default=100, help=f"{RESTARTS}: steps between checkpoints"
    )
    ap.add_argument("--budget", type=float, default=900.0, help="seconds per run at most")
    ap.add_argument(
        "--cluster",
        help="an emulated cluster spec (s1-homogeneous, ...; root): one replica per host, the "
        "Lighthouse on host 0, built once for the whole race",
    )
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.render:
        print(render(json.loads(Path(a.render).read_text())))
        return 0
    if not a.out:
        ap.error("--out is required (or --render RESULT)")
    methods = a.methods.split(",")
    if a.heartbeat_ms:  # each method at each heartbeat timeout, as methods of their own
        methods = [f"{m} hb={h}" for m in methods for h in a.heartbeat_ms.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.cluster and any(m.startswith(RESTARTS) for m in methods):
        ap.error(f"{RESTARTS} runs torchrun on this machine only; race it without --cluster")
    commit = subprocess.run(  # the code that runs: read before the race, which takes hours
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    with contextlib.ExitStack() as stack:
        hosts = None
        if a.cluster:
            from dssync.lab.cluster import Cluster, load_cluster
            from dssync.lab.elastic.launch import Hosts

            cluster = stack.enter_context(Cluster(load_cluster(a.cluster)))
            hosts = Hosts.on_cluster(cluster)
        runs = race(methods, seeds, a, hosts)
    return report(runs, methods, seeds, a, commit)


def race(methods: list[str], seeds: list[int], a: argparse.Namespace, hosts) -> list[dict]:
    """Every method and seed with and without failures, interleaved (module docstring)."""
    runs: list[dict] = []
    for i, seed in enumerate(seeds):
        order = methods if i % 2 == 0 else methods[::-1]
        for j, method in enumerate(order):
            sides = [None, a.chaos_every] if (i + j) % 2 == 0 else [a.chaos_every, None]
            for every in sides:
                word = "without failures" if every is None else f"a kill every ~{every:g} s"
                print(f"{method} seed {seed}, {word}", flush=True)
                t0 = time.monotonic()
                r = one_run(method, seed, every, a, hosts)
                r["wall_s"] = time.monotonic() - t0
                print(f"  {json.dumps({k: v for k, v in r.items() if k != 'evals'})}", flush=True)
                runs.append(r)
    return runs


def report(
    runs: list[dict], methods: list[str], seeds: list[int], a: argparse.Namespace, commit: str
) -> int:
    """Pair each run with failures with its run without; print and write the result file."""
    pairs = []
    for method in methods:
        for seed in seeds:
            calm, chaos = (
                next(r for r in runs if (r["method"], r["seed"]) == (method, seed)
                     and (r["chaos_every_s"] is None) == want)
                for want in (True, False)
            )  # fmt: skip
            goodput = chaos["samples_per_s"] / calm["samples_per_s"]
            pairs.append(
                {"method": method, "seed": seed, "goodput": goodput, "calm": calm, "chaos": chaos}
            )
    spread = {
        m: {
            "goodput_median": statistics.median(p["goodput"] for p in pairs if p["method"] == m),
            "goodput_min": min(p["goodput"] for p in pairs if p["method"] == m),
            "goodput_max": max(p["goodput"] for p in pairs if p["method"] == m),
        }
        for m in methods
    }
    text = table(pairs, a.target)
    print(text)
    print(json.dumps(spread, indent=1))
    result = {
        "command": "PYTHONPATH=src python tools/goodput_elastic.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": f"{os.cpu_count()} cores, shared (loaded by other work)",
        "settings": vars(a),
        "method_settings": {m: settings_of(m)[1] for m in methods},
        "summary": spread,
        "pairs": pairs,
        "table": text,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
