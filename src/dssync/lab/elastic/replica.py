"""One replica of an elastic run, as its own process (started by :mod:`dssync.lab.elastic.launch`).

    python -m dssync.lab.elastic.replica FOLDER REPLICA LIGHTHOUSE

FOLDER holds ``config.json`` (the run's TrainConfig, ``replicas`` and ``min_replicas``). The
replica trains shard REPLICA of the workload's data, writes one JSON line per step to
``FOLDER/steps.jsonl`` (pid, replica, step, time, the last quorum's members, what the step's
averaging did and whether it healed this replica where the method says, a digest of the
parameters; at each evaluation ``eval_step``, time and the replica's own metric), and at the end
takes one average over the live replicas, evaluates it and writes ``FOLDER/summary{REPLICA}.json``.
The others reach it at the address in ``DSSYNC_REPLICA_HOST`` (default ``127.0.0.1``).
A first start writes ``FOLDER/ready{REPLICA}`` once its data is loaded and waits for
``FOLDER/go`` (so the first quorum holds every replica); a restart finds ``go`` and joins at once.
It ends when the process that started it ends.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from dssync.lab.config import TrainConfig
from dssync.lab.elastic.launch import HOST_ENV
from dssync.lab.launch import exit_quietly
from dssync.lab.train.data import RankData
from dssync.lab.train.summary import evaluate, header, model_digest

GO_WAIT_S = 300.0  # the longest a first start waits for the others to load their data


def orphan_watch(parent: int) -> None:
    """End this process when the launcher that started it is gone (nothing outlives a run)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def parameters_digest(model: torch.nn.Module) -> str:
    """sha256 of the parameters alone: equal on replicas that just averaged them."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def train_replica(folder: Path, n: int, lighthouse: str) -> dict[str, Any]:
    """Train replica ``n`` of the run described in ``folder``; return its summary."""
    from dssync.elastic import ReplicaManager
    from dssync.lab.elastic.methods import build_trainer
    from dssync.lab.train.loop import evaluation_due

    spec = json.loads((folder / "config.json").read_text())
    cfg, replicas = TrainConfig(**spec["config"]), spec["replicas"]
    torch.set_num_threads(spec.get("threads", 1))
    data = RankData.load(cfg, n, replicas)
    torch.manual_seed(cfg.seed)  # every replica starts from the same model
    model = data.wl.model()
    opt = data.wl.optimizer(model.parameters())
    log = open(folder / "steps.jsonl", "a")  # noqa: SIM115 - open for the whole run

    def write(**record: Any) -> None:
        log.write(json.dumps({"pid": os.getpid(), "replica": n, **record}) + "\n")
        log.flush()

    # The manager heartbeats to the Lighthouse from here on, before the first quorum: the
    # Lighthouse then waits for every replica it heard of, so all start at step 1 together.
    manager = ReplicaManager(
        f"replica_{n}",
        lighthouse,
        min_replicas=spec["min_replicas"],
        timeout_s=cfg.timeout_s,
        quorum_timeout_s=spec.get("quorum_timeout_s", cfg.timeout_s),
        host=os.environ.get(HOST_ENV, "127.0.0.1"),
    )
    go = folder / "go"
    if not go.exists():
        (folder / f"ready{n}").touch()
        deadline = time.monotonic() + GO_WAIT_S
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    trainer = build_trainer(cfg, model, opt, manager)
    torch.manual_seed(cfg.seed * 1000 + n)
    total = data.total_steps()
    evals: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    train_s = sync_s = 0.0
    started = trainer.steps
    while trainer.steps < total:
        step = trainer.steps
        batch = data.batch(step)
        t0 = time.perf_counter()
        loss = data.wl.loss(model, batch)
        loss.backward()
        t1 = time.perf_counter()
        opt.step()  # torchft's DiLoCo and LocalSGD synchronize here, in its hooks
        trainer.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        train_s += t2 - t0
        sync_s += t2 - t1
        rows.append({"step": trainer.steps, "time_s": train_s, "iter_s": t2 - t0})
        write(
            step=trainer.steps,
            time=time.time(),
            loss=loss.item(),
            members=trainer.members,
            outcome=trainer.outcome,
            healed=trainer.healed,
            params=parameters_digest(model),
        )
        if evaluation_due(cfg, trainer.steps, data.steps_per_epoch, total):
            metrics = evaluate(data.wl, model, data.test)
            evals.append({"step": trainer.steps, "time_s": train_s, **metrics})
            write(eval_step=trainer.steps, time=time.time(), metric=metrics[data.wl.metric_name])
    own = evaluate(data.wl, model, data.test)
    trainer.average_all()
    final = evaluate(data.wl, model, data.test)
    digest = model_digest(model)
    write(final=True, members=trainer.members, sha256=digest)
    trainer.close()
    done = max(len(rows), 1)
    wl = data.wl
    return {
        **header(cfg, wl, final),
        "replica": n,
        "replicas": replicas,
        "world_size": replicas,
        "device": "cpu",
        "worker_metric": [own[wl.metric_name]],
        "swa_metric": None,
        "consensus_distance": None,
        "final_model_sha256": [digest],
        "members_at_end": trainer.members,
        "steps": trainer.steps,
        "steps_here": len(rows),
        "first_step": started,
        "iter_time_s": train_s / done,
        "sync_time_s": sync_s / done,
        "compute_time_s": (train_s - sync_s) / done,
        "train_time_s": train_s,
        "evals": evals,
        "log": rows,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(
            "usage: python -m dssync.lab.elastic.replica FOLDER REPLICA LIGHTHOUSE", file=sys.stderr
        )
        return 2
    orphan_watch(os.getppid())
    folder, n = Path(argv[0]), int(argv[1])
    summary = train_replica(folder, n, argv[2])
    tmp = folder / f"summary{n}.tmp"
    tmp.write_text(json.dumps(summary))
    os.replace(tmp, folder / f"summary{n}.json")
    return 0


if __name__ == "__main__":
    exit_quietly(main(sys.argv[1:]))
