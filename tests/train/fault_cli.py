"""``python fault_cli.py [--crash-rank R --crash-at-step S | --kill-rank R --kill-writing-step S]
ARGS...``: the dssync CLI with a crash injected through a step hook (tests only): an exit after
step S, or a SIGKILL while rank R writes its checkpoint of step S. Either happens once per
checkpoint folder."""

from __future__ import annotations

import functools
import sys

from faults import CrashAfter, KilledWhileWriting

import dssync.lab.cli.train_cmd as train_cmd
from dssync.lab.cli import main


def _pop(argv: list[str], flag: str) -> str | None:
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


if __name__ == "__main__":
    argv = sys.argv[1:]
    rank, step = _pop(argv, "--crash-rank"), _pop(argv, "--crash-at-step")
    folder = argv[argv.index("--checkpoint-dir") + 1] if "--checkpoint-dir" in argv else None
    if rank is not None:
        hook = CrashAfter(int(rank), int(step), folder)
        train_cmd.run_training = functools.partial(train_cmd.run_training, hook=hook)
    killed, writing = _pop(argv, "--kill-rank"), _pop(argv, "--kill-writing-step")
    if killed is not None:
        hook = KilledWhileWriting(int(killed), int(writing), folder)
        train_cmd.run_training = functools.partial(train_cmd.run_training, hook=hook)
    main(argv)
