"""Misuse never hangs and never corrupts: each case a user met, and the error it now raises."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from dssync import DSSync, Shuffle, Static, nesterov
from dssync.errors import SyncError
from dssync.lab.launch import WorkerError, spawn

TIMEOUT_S = 4.0


def _report(out_dir: str, fn) -> None:
    """Run ``fn``; write what it raised (or 'ok') for the test to read; exit non-zero on error."""
    t0 = time.monotonic()
    try:
        fn()
        result, code = "ok", 0
    except SyncError as e:
        result, code = f"{type(e).__name__}|{e.step}|{e.group}|{e.ranks}|{e}", 3
    Path(out_dir, str(dist.get_rank())).write_text(f"{time.monotonic() - t0:.2f}|{result}")
    if code:  # a failed rank's exit makes spawn kill the rest: first let every rank report
        end = time.monotonic() + 30
        while time.monotonic() < end and len(list(Path(out_dir).iterdir())) < dist.get_world_size():
            time.sleep(0.05)
        os._exit(code)


def _reports(tmp_path: Path, world: int) -> list[list[str]]:
    return [Path(tmp_path, str(r)).read_text().split("|", 5) for r in range(world)]


def _extra_step(out_dir: str, then_average_all: bool):
    sync = DSSync(nn.Linear(4, 4), schedule=Shuffle(2, seed=0), timeout_s=TIMEOUT_S)

    def run() -> None:
        for _ in range(3 + (dist.get_rank() == 1)):
            sync.step()
        if then_average_all:
            sync.average_all()

    _report(out_dir, run)


def test_extra_step_on_one_of_four_ranks_fails_every_rank_within_the_timeout(tmp_path):
    """It used to hang 30 minutes, or fail with a bare gloo timeout naming no step, group or rank."""
    with pytest.raises(WorkerError):
        spawn(_extra_step, 4, args=(str(tmp_path), True), timeout_s=90, collective_timeout_s=60)
    reports = _reports(tmp_path, 4)
    for seconds, kind, step, _group, _ranks, message in reports:
        assert kind == "PeerLost", message
        assert float(seconds) < TIMEOUT_S + 12  # the rank's own timeout, plus the roll call
        assert "never came" in message and f"averaging {step}" in message
    assert reports[1][2] == "3" and reports[0][2] == "3"
    partner = next(g for g in Shuffle(2, seed=0).partition(3, 4) if 1 in g)
    assert eval(reports[1][4]) == [r for r in partner if r != 1]  # the extra step names its partner
    for rank in (0, 2, 3):  # the others, in average_all, name the rank that never came
        assert eval(reports[rank][3]) == [0, 1, 2, 3] and eval(reports[rank][4]) == [1]


def test_extra_step_then_average_all_on_two_ranks_is_an_error_not_a_wrong_model(tmp_path):
    """Rank 0's extra step used to pair with rank 1's average_all: rank 1 ended with a wrong model."""
    with pytest.raises(WorkerError):
        spawn(_extra_step_two, 2, args=(str(tmp_path),), timeout_s=90, collective_timeout_s=60)
    for _seconds, kind, _step, group, _ranks, message in _reports(tmp_path, 2):
        assert kind == "SyncError", message
        assert (
            "group average at averaging 3" in message or "average_all() at averaging 3" in message
        )
        assert eval(group) == [0, 1]


def _extra_step_two(out_dir: str):
    sync = DSSync(nn.Linear(4, 4), schedule=Shuffle(2, seed=0), timeout_s=TIMEOUT_S)

    def run() -> None:
        for _ in range(3 + (dist.get_rank() == 0)):
            sync.step()
        sync.average_all()

    _report(out_dir, run)


def _odd(setting: str):
    rank = dist.get_rank()
    m = nn.Linear(4, 4)
    kwargs: dict = {}
    if setting == "bucket_bytes":
        kwargs["bucket_bytes"] = 1024 if rank == 1 else 4096
    elif setting == "optimizer":
        if rank == 0:
            kwargs["optimizer"] = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    elif setting == "average_buffers":
        kwargs["average_buffers"] = rank != 1
    elif setting == "frozen":
        m.bias.requires_grad_(rank != 1)
    elif setting == "dtype":
        m = m.double() if rank == 1 else m
    DSSync(m, schedule=Shuffle(2, uneven=True), **kwargs)


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        (
            "bucket_bytes",
            "ranks disagree on the bucket_bytes (largest buffer): ranks [1] differ from rank 0 "
            "(rank 0 has 4096, rank 1 has 1024); pass the same bucket_bytes= on every rank",
        ),
        (
            "optimizer",
            "optimizer (given or not, its type and the parameters it holds): ranks [0] differ "
            "from rank 1 (rank 1 has None, rank 0 has SGD over weight, bias); "
            "pass optimizer= on every rank or on none",
        ),
        (
            "average_buffers",
            "average_buffers (floating buffers averaged): ranks [1] differ from rank 0",
        ),
        (
            "frozen",
            "frozen parameters (requires_grad=False) and average_frozen: ranks [1] differ from rank 0",
        ),
        (
            "dtype",
            "model (parameter and buffer names, shapes, dtypes): ranks [1] differ from rank 0",
        ),
    ],
)
def test_start_up_disagreement_names_the_odd_rank(setting, words):
    """A differing bucket_bytes used to hang at construction; optimizer= on rank 0 only corrupted momentum."""
    with pytest.raises(WorkerError) as info:
        spawn(_odd, 3, args=(setting,), timeout_s=120, collective_timeout_s=30)
    assert info.value.exc_type == "UsageError"
    assert words in info.value.message


def _frozen(average_frozen: bool):
    rank = dist.get_rank()
    torch.manual_seed(rank)
    m = nn.Sequential(nn.Linear(16, 16).bfloat16(), nn.Linear(16, 2).bfloat16())
    m[0].requires_grad_(False)  # a frozen backbone
    sync = DSSync(m, schedule=Shuffle(3, seed=0), average_frozen=average_frozen)
    start = m[0].weight.detach().clone()
    for _ in range(5):
        with torch.no_grad():
            m[1].weight.add_(0.1 * (rank + 1))
        sync.step()
    return torch.equal(m[0].weight, start), sync._buckets.numel


def test_frozen_parameters_are_not_averaged_and_never_drift():
    """Frozen bfloat16 parameters used to be averaged every step and drift in groups of 3."""
    trainable = 16 * 2 + 2
    for unchanged, numel in spawn(_frozen, 3, args=(False,), timeout_s=120):
        assert unchanged and numel == trainable
    assert all(
        numel == trainable + 16 * 16 + 16
        for _, numel in spawn(_frozen, 3, args=(True,), timeout_s=120)
    )


def _integer_buffers():
    rank = dist.get_rank()
    m = nn.Linear(2, 2)
    m.register_buffer("perm", torch.randperm(10, generator=torch.Generator().manual_seed(rank)))
    m.register_buffer("mask", torch.arange(10) % (rank + 2) == 0)
    DSSync(m)
    return m.perm.clone(), m.mask.clone()


def test_integer_and_bool_buffers_start_from_rank0():
    """They used to be left as each rank made them."""
    out = spawn(_integer_buffers, 2, timeout_s=120)
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert torch.equal(out[1][0], torch.randperm(10, generator=torch.Generator().manual_seed(0)))


def _wrapped():
    DSSync(DistributedDataParallel(nn.Linear(2, 2)))


def test_ddp_wrapped_model_is_refused_with_the_fix():
    """It used to be accepted: the user paid for both synchronizations."""
    with pytest.raises(WorkerError) as info:
        spawn(_wrapped, 2, timeout_s=120)
    assert info.value.exc_type == "UsageError"
    assert "pass the plain module (ddp_model.module) to DSSync" in info.value.message


def _shuffle3():
    DSSync(nn.Linear(2, 2), schedule=Shuffle(3))


def test_group_size_that_does_not_divide_the_world_is_refused():
    """Shuffle(3) on 4 ranks used to become pairs silently."""
    with pytest.raises(WorkerError) as info:
        spawn(_shuffle3, 4, timeout_s=120)
    assert info.value.exc_type == "UsageError"
    assert (
        "group_size=3 does not divide world_size=4; use 1, 2 or 4, or pass uneven=True"
        in info.value.message
    )


def _uneven_inputs(schedule, **options):
    rank = dist.get_rank()
    m = nn.Linear(3, 1, bias=False)
    sync = DSSync(m, schedule=schedule, timeout_s=30, **options)
    with Join([sync]):
        for _ in range(2 + 2 * rank):  # rank r runs out of data after 2 + 2r steps
            with torch.no_grad():
                m.weight.add_(rank)
            sync.step()
    sync.average_all()
    return sync.steps, m.weight.detach().clone(), sync.averagings


@pytest.mark.parametrize("schedule", [Shuffle(2, seed=0), Static([[0, 1, 2, 3]])], ids=repr)
def test_join_lets_ranks_out_of_data_serve_their_groups(schedule):
    """Uneven inputs: ranks that finish early keep taking their part until every rank is done."""
    out = spawn(_uneven_inputs, 4, args=(schedule,), timeout_s=180, collective_timeout_s=60)
    assert [steps for steps, _, _ in out] == [8, 8, 8, 8]
    for _, w, _ in out:
        assert torch.equal(w, out[0][1])


@pytest.mark.parametrize(
    "options",
    [
        {"every": 3},
        {"every": 2, "overlap": True},
        {"every": 2, "outer": nesterov()},
        {"every": 2, "overlap": True, "outer": nesterov()},
    ],
)
def test_join_counts_local_steps_alike_on_every_rank(options):
    """A joined rank shadows the others' steps, so averagings (every H-th step) stay matched."""
    out = spawn(_uneven_inputs_with, 4, args=(options,), timeout_s=180, collective_timeout_s=60)
    every = options["every"]
    assert [(steps, n) for steps, _, n in out] == [(8, 8 // every)] * 4
    for _, w, _ in out:
        torch.testing.assert_close(w, out[0][1], rtol=0, atol=1e-6)


def _uneven_inputs_with(options):
    return _uneven_inputs(Shuffle(2, seed=0), **options)
