"""A checkpoint is data, not code: a file whose unpickling would run code is refused, unrun."""

from __future__ import annotations

import pytest
from cli_run import DIGITS, run

from dssync.lab.train.checkpoint import CheckpointError, read_checkpoint, write_checkpoint

HEADER = {"world_size": 2, "workload": "digits", "sync": "dssync", "workload_options": {}}


class CreatesFile:
    """Unpickling this calls open(path, "w"): code run by merely loading the checkpoint."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _crafted(folder, target, ranks=(0,)):
    return [
        write_checkpoint(folder, r, 10, HEADER, {"model": {}, "payload": CreatesFile(str(target))})
        for r in ranks
    ]


def test_reading_a_crafted_checkpoint_runs_nothing(tmp_path):
    target = tmp_path / "pwned"
    (path,) = _crafted(tmp_path / "ckpt", target)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert not target.exists()
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "tensors and plain data" in message


@pytest.mark.timeout(200)
def test_resuming_from_a_crafted_checkpoint_exits_2_with_one_line(tmp_path):
    target = tmp_path / "pwned"
    ckpt = tmp_path / "ckpt"
    _crafted(ckpt, target, ranks=(0, 1))
    r = run(["train", *DIGITS, "--checkpoint-dir", str(ckpt), "--resume"])
    assert r.returncode == 2, r.stderr[-2000:]
    assert not target.exists()
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr and lines[-1].startswith("error: ")
    assert "holds objects other than tensors and plain data" in lines[-1]
