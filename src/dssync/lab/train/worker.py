"""One rank of a training run started by torchrun (on each host of an emulated cluster, or a job).

    torchrun --nnodes H --nproc-per-node R ... -m dssync.lab.train.worker CONFIG.json SUMMARY.json
    torchrun --nnodes H --nproc-per-node R ... -m dssync.lab.train.worker --runs RUNS.json

The first reads a TrainConfig from CONFIG.json, joins the process group torchrun describes (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and, on whichever host rank 0 landed, writes the full summary
(with the per-step log) to SUMMARY.json, so SUMMARY.json must be on storage every host sees.
With a third path, PROGRESS.json, rank 0 also writes ``{"step": n}`` there after every step (a
benchmark's harness reads it to change links at fractions of the run).

The second makes several runs in one launch (:func:`dssync.lab.train.run.train_series`): RUNS.json
is a list of ``{"config": {...}, "summary": PATH}``, and each summary is written as its run ends.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dssync.lab.config import TrainConfig
from dssync.lab.launch import exit_quietly
from dssync.lab.train.hooks import StepHook
from dssync.lab.train.run import run_training, train_series
from dssync.lab.train.summary import write_json


class ProgressFile(StepHook):
    """Rank 0 writes the step it finished to ``path`` (atomically) after every step."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def after_step(self, rank: int, step: int) -> None:
        if rank == 0:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": step}))
            os.replace(tmp, self.path)


USAGE = (
    "usage: python -m dssync.lab.train.worker CONFIG.json SUMMARY.json [PROGRESS.json]\n"
    "       python -m dssync.lab.train.worker --runs RUNS.json"
)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--runs"] and len(argv) == 2:
        runs = json.loads(Path(argv[1]).read_text())
        cfgs = [TrainConfig(**run["config"]) for run in runs]

        def done(i: int, summary: dict | None) -> None:
            if summary is not None:
                write_json(runs[i]["summary"], summary)

        train_series(cfgs, done)
        return 0
    if len(argv) not in (2, 3) or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        cfg = TrainConfig(**json.load(f))
    summary = run_training(cfg, hook=ProgressFile(argv[2]) if len(argv) == 3 else None)
    if summary is not None:
        write_json(argv[1], summary)
    return 0


if __name__ == "__main__":
    exit_quietly(main(sys.argv[1:]))
