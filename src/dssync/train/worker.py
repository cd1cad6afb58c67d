"""One rank of a training run started by torchrun (on each host of an emulated cluster, or a job).

    torchrun --nnodes H --nproc-per-node R ... -m dssync.train.worker CONFIG.json SUMMARY.json

reads a TrainConfig from CONFIG.json, joins the process group torchrun describes (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and, on whichever host rank 0 landed, writes the full summary
(with the per-step log) to SUMMARY.json, so SUMMARY.json must be on storage every host sees.
"""

from __future__ import annotations

import json
import sys

from dssync.launch import exit_quietly
from dssync.train.config import TrainConfig
from dssync.train.run import run_training
from dssync.train.summary import write_json


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m dssync.train.worker CONFIG.json SUMMARY.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        cfg = TrainConfig(**json.load(f))
    summary = run_training(cfg)
    if summary is not None:
        write_json(argv[1], summary)
    return 0


if __name__ == "__main__":
    exit_quietly(main(sys.argv[1:]))
