"""Checkpoints belong to their run and their rank: a file copied over another rank's, a file of
another run, or a file renamed to another step is refused on every rank, naming the file and
what differs, and a refused resume changes nothing on disk. The run identity is chosen at the
first start and kept across resumes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync.lab.launch import spawn
from dssync.lab.train.checkpoint import CheckpointError, checkpoint_path, read_header
from dssync.lab.train.state import Checkpointer, RunState

HEADER = {"world_size": 2, "workload": "digits", "sync": "dssync"}


class _Plain:
    """The least a Checkpointer needs of a strategy."""

    timeout_s = 30.0

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _saver(folder: str, lr: float = 0.1) -> Checkpointer:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return Checkpointer(folder, rank, world, {**HEADER, "world_size": world}, _Plain(model), opt)


def _write(folder: str, steps: tuple[int, ...], lr: float = 0.1) -> str:
    saver = _saver(folder, lr)
    for step in steps:
        saver.save(RunState(step=step), None)
    return saver.header.get("run")


def _resume(folder: str, save_at: int | None = None):
    saver = _saver(folder)
    try:
        found = saver.resume()
    except CheckpointError as e:
        return "refused", str(e)
    if save_at is not None:
        saver.save(RunState(step=save_at), None)
    return found.run.step, saver.header.get("run")


def _disk(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _refused_alike(folder: Path) -> str:
    before = _disk(folder)
    out = spawn(_resume, 2, args=(str(folder),), timeout_s=120)
    assert [kind for kind, _ in out] == ["refused", "refused"], out
    assert out[0][1] == out[1][1]  # every rank raises the same error
    assert _disk(folder) == before  # nothing on disk was changed by the refused resume
    return out[0][1]


@pytest.mark.slow
def test_the_run_identity_is_kept_across_resumes_and_new_for_a_new_run(tmp_path):
    first = spawn(_write, 2, args=(str(tmp_path / "a"), (10,)), timeout_s=120)
    assert first[0] == first[1]  # one identity, every rank
    resumed = spawn(_resume, 2, args=(str(tmp_path / "a"), 20), timeout_s=120)
    assert resumed == [(10, first[0]), (10, first[0])]
    for rank in range(2):
        assert read_header(checkpoint_path(tmp_path / "a", rank, 20))["run"] == first[0]
    other = spawn(_write, 2, args=(str(tmp_path / "b"), (10,)), timeout_s=120)
    assert other[0] != first[0]


@pytest.mark.slow
def test_rank_zeros_file_copied_over_rank_ones_is_refused(tmp_path):
    folder = tmp_path / "a"
    spawn(_write, 2, args=(str(folder), (10,)), timeout_s=120)
    shutil.copy(checkpoint_path(folder, 0, 10), checkpoint_path(folder, 1, 10))
    message = _refused_alike(folder)
    assert f"checkpoint {checkpoint_path(folder, 1, 10)} holds rank 0's state, not rank 1's" in (
        message
    )


@pytest.mark.slow
def test_a_file_of_another_run_is_refused_naming_both_runs(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    (ours_id, _) = spawn(_write, 2, args=(str(ours), (10,)), timeout_s=120)
    (theirs_id, _) = spawn(_write, 2, args=(str(theirs), (10,), 0.5), timeout_s=120)
    shutil.copy(checkpoint_path(theirs, 1, 10), checkpoint_path(ours, 1, 10))
    message = _refused_alike(ours)
    assert (
        f"checkpoint {checkpoint_path(ours, 1, 10)} (run {theirs_id}) belongs to another run "
        f"than the other files of step 10 (run {ours_id})"
    ) in message


@pytest.mark.slow
def test_a_file_renamed_to_another_step_is_named_as_renamed(tmp_path):
    """Before: "ranks out of step ... every rank must call step() equally often"."""
    folder = tmp_path / "a"
    spawn(_write, 2, args=(str(folder), (10, 20)), timeout_s=120)
    checkpoint_path(folder, 1, 10).replace(checkpoint_path(folder, 1, 20))
    message = _refused_alike(folder)
    assert (
        f"checkpoint {checkpoint_path(folder, 1, 20)} was renamed: its name says step 20, "
        "it holds rank 1's state of step 10"
    ) in message
    assert "out of step" not in message


@pytest.mark.parametrize(("step", "words"), [(30, "skips its first 160 samples"), (40, None)])
def test_an_elastic_resume_says_how_many_samples_of_its_epoch_it_skips(step, words):
    saver = Checkpointer(
        "unused",
        0,
        4,
        {**HEADER, "steps_per_epoch": 20, "batch_size": 4},
        _Plain(nn.Linear(1, 1)),
        torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1),
    )
    line = saver._skipped(step, saved_world=2)
    if words is None:
        assert line is None  # an epoch boundary on 4 workers: nothing skipped
    else:
        assert words in line and "batch 10 of 20 of epoch 1 on 4 workers" in line
