"""The goodput race's row for DS-Sync without torchft: torchrun ``--max-restarts`` from checkpoints.

One run is ``torchrun --standalone --nproc-per-node R --max-restarts 1000 -m
dssync.lab.train.worker`` on the same job as the elastic rows (the workload, batch, steps,
``timeout_s`` and seed of :mod:`goodput_elastic`), DS-Sync's preset (pairs, every step), each
rank writing its checkpoint every ``--checkpoint-every`` steps and resuming from the newest.
With failures, a random worker process is SIGKILLed about every ``chaos_every`` seconds (20%
either way, drawn from the seed, as the elastic launcher's punisher); torchrun then stops the
others and starts all R again, and they resume from the last complete checkpoint.

Rank 0's step after every step (``PROGRESS.json``, read every 10 ms) is the record:
- job time: from its first step to its step ``--steps``;
- samples: the job's, ``--steps`` times R ranks times the batch. Steps done again after a
  restart (from the checkpoint it resumed from, the last multiple of ``--checkpoint-every``
  below the first step seen after it) are waste, not goodput: they are counted apart
  (``steps_taken``, a lower bound: a step between the last poll and a kill is missed). The
  elastic rows count every step of every replica process, but lose at most a few a kill;
- kills: the first about ``chaos_every`` after the first step, each next about ``chaos_every``
  after the one before, as the elastic punisher; one that falls due during a restart's start-up
  waits until the new workers have stepped, and none comes after the last step;
- stall per kill: the longest gap between two of rank 0's steps from 5 s before a kill to 30 s
  after it (here the whole job stops: the restart's cost).
Time to target is not measured for this row (a resumed run's evaluations restart their clock).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.01


def read_step(path: Path) -> int | None:
    try:
        return json.loads(path.read_text())["step"]
    except (OSError, ValueError, KeyError):
        return None


def steps_taken(trace: list[tuple[float, int]], every: int) -> tuple[int, list[int]]:
    """Steps rank 0 took in ``trace`` ((time, step) at each change seen), those done again after
    a restart included, and the checkpoint each restart resumed from (the last multiple of
    ``every``, the checkpoint interval, below the first step seen after it)."""
    taken, resumed, top = 0, [], 0
    for _, step in trace:
        if step > top:
            taken += step - top
        elif step < top:  # resumed from a checkpoint: the steps after it are done again
            resumed.append((step - 1) // every * every)
            taken += step - resumed[-1]
        top = step
    return taken, resumed


def longest_gaps(trace: list[tuple[float, int]], kills: list[float], window_s: float = 30.0):
    out = []
    for k in kills:
        near = [t for t, _ in trace if k - 5 <= t <= k + window_s]
        gaps = [b - a for a, b in zip(near, near[1:], strict=False)]
        if gaps:
            out.append(round(max(gaps), 3))
    return out


def one_run(label: str, seed: int, chaos_every: float | None, a) -> dict:
    from dssync.lab.config import TrainConfig
    from dssync.lab.launch import children, kill_tree
    from dssync.lab.methods import configure

    every = int(label.partition("@")[2] or 1)
    with tempfile.TemporaryDirectory(prefix="goodput-restarts-") as tmp:
        folder = Path(tmp)
        cfg = TrainConfig(
            workload=a.workload, sync="dssync", epochs=10_000, batch_size=a.batch_size,
            max_steps=a.steps, timeout_s=a.timeout_s, seed=seed, every=every,
            checkpoint_dir=str(folder / "ckpt"), checkpoint_every=a.checkpoint_every, resume=True,
        )  # fmt: skip
        cfg.progress = False
        cfg = configure(cfg)
        (folder / "config.json").write_text(json.dumps(asdict(cfg)))
        progress, summary = folder / "progress.json", folder / "summary.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(a.replicas), "--max-restarts", "1000",
               "-m", "dssync.lab.train.worker", str(folder / "config.json"), str(summary),
               str(progress)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
        log = open(folder / "torchrun.log", "w")  # noqa: SIM115 - closed below
        agent = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        rng = random.Random(seed)
        trace: list[tuple[float, int]] = []
        kills: list[float] = []
        next_kill: float | None = None
        killed: set[int] = set()  # the workers of the last kill's incarnation
        fresh_at: float | None = 0.0  # when a new incarnation's workers were first seen
        deadline = time.monotonic() + a.budget
        try:
            while agent.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{label} seed {seed} ran past --budget {a.budget:g} s")
                step, now = read_step(progress), time.time()
                if step is not None and (not trace or step != trace[-1][1]):
                    trace.append((now, step))
                if chaos_every is not None and fresh_at is None:
                    pids = set(children(agent.pid))
                    if len(pids) == a.replicas and not pids & killed:
                        fresh_at = now
                if chaos_every is not None and next_kill is None and trace:
                    next_kill = trace[0][0] + chaos_every * rng.uniform(0.8, 1.2)
                stepped = fresh_at is not None and trace and trace[-1][0] > fresh_at
                due = next_kill is not None and now >= next_kill and trace[-1][1] < a.steps
                if due and stepped:  # a kill due during a restart's start-up waits for its end
                    pids = children(agent.pid)
                    if not pids:
                        raise RuntimeError(f"no worker of torchrun (pid {agent.pid}) to kill")
                    try:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                    except ProcessLookupError:  # it ended meanwhile: the next poll tries again
                        continue
                    kills.append(now)
                    killed, fresh_at = set(pids), None
                    next_kill = now + chaos_every * rng.uniform(0.8, 1.2)  # from this kill
                    print(f"    killed a worker at step {trace[-1][1]}", flush=True)
                time.sleep(POLL_S)
        finally:
            if agent.poll() is None:  # torchrun starts each worker in a session of its own
                kill_tree(agent.pid)
                agent.wait()
            log.close()
        if agent.returncode != 0:
            tail = (folder / "torchrun.log").read_text()[-3000:]
            raise RuntimeError(f"{label} seed {seed}: torchrun exited {agent.returncode}:\n{tail}")
        result = json.loads(summary.read_text())
    taken, resumed = steps_taken(trace, a.checkpoint_every)
    start = trace[0][0]
    end = next((t for t, s in trace if s == a.steps), None)
    if end is None:
        raise RuntimeError(f"{label} seed {seed}: rank 0's step {a.steps} was never read")
    samples = a.steps * a.replicas * a.batch_size  # the job's own: steps done again are waste
    return {
        "method": label,
        "seed": seed,
        "chaos_every_s": chaos_every,
        "kills": len(kills),
        "stalls_s": longest_gaps(trace, kills),
        "restarts": len(kills),
        "resumed_after": resumed,
        "steps_taken": taken,
        "finished": a.replicas,
        "job_s": end - start,
        "samples": samples,
        "samples_per_s": samples / (end - start),
        "time_to_target_s": None,
        "final_metric": result["final_metric"],
        "one_model": len(set(result["final_model_sha256"])) == 1,
        "evals": [],
    }
