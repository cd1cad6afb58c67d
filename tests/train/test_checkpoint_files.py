"""Checkpoint files: atomic writes, checksums, keeping two, and ranks agreeing on a step."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from dssync.lab.launch import spawn
from dssync.lab.train.checkpoint import (
    CheckpointDamaged,
    CheckpointError,
    checkpoint_path,
    rank_checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from dssync.lab.train.resume import agree_on_step, check_fits, newest_complete

HEADER = {"world_size": 2, "workload": "digits", "sync": "dssync"}


def test_round_trip_and_keep_two(tmp_path):
    for step in (10, 20, 30):
        write_checkpoint(tmp_path, 0, step, HEADER, {"step": step, "x": [1, 2]})
    assert sorted(rank_checkpoints(tmp_path, 0)) == [20, 30]
    header, state = read_checkpoint(checkpoint_path(tmp_path, 0, 30))
    assert header["step"] == 30 and header["world_size"] == 2 and state == {"step": 30, "x": [1, 2]}
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_damage_is_detected_and_names_the_file(tmp_path, damage):
    path = write_checkpoint(tmp_path, 0, 10, HEADER, {"w": list(range(100))})
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-20] ^= 0xFF
    else:
        data = bytearray(b"not a checkpoint at all")
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamaged, match=str(path)):
        read_checkpoint(path)


def test_another_world_size_fits_another_workload_is_refused_with_the_fix(tmp_path):
    path = checkpoint_path(tmp_path, 0, 10)
    check_fits(path, {**HEADER, "world_size": 4}, HEADER)  # elastic resume: N workers -> M
    with pytest.raises(
        CheckpointError,
        match=r"workload 'mnist', this run has 'digits'; resume with --workload mnist",
    ):
        check_fits(path, {**HEADER, "workload": "mnist"}, HEADER)


def test_the_newest_step_complete_for_the_world_that_wrote_it(tmp_path):
    for rank in range(4):
        write_checkpoint(tmp_path, rank, 10, {**HEADER, "world_size": 4}, {"rank": rank})
    for rank in range(3):  # step 20: rank 3's file is missing
        write_checkpoint(tmp_path, rank, 20, {**HEADER, "world_size": 4}, {"rank": rank})
    assert newest_complete(tmp_path, HEADER) == (10, 4)
    write_checkpoint(tmp_path, 3, 20, {**HEADER, "world_size": 4}, {"rank": 3})
    assert newest_complete(tmp_path, HEADER) == (20, 4)


def _agree(folder: str, corrupt_rank: int | None) -> int | None:
    rank = dist.get_rank()
    for step in (10, 20):
        write_checkpoint(folder, rank, step, HEADER, {"rank": rank, "step": step})
    dist.barrier()
    if rank == corrupt_rank:
        path = checkpoint_path(folder, rank, 20)
        path.write_bytes(path.read_bytes()[:-7])
    dist.barrier()
    return agree_on_step(folder, rank, HEADER)


@pytest.mark.timeout(120)
def test_ranks_fall_back_together_to_the_previous_good_step(tmp_path):
    assert spawn(_agree, 2, args=(str(tmp_path / "b"), 1), timeout_s=90) == [(10, 2), (10, 2)]
