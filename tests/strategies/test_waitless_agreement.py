"""AsyncDSSync agrees at start-up as DSSync does: a model of another dtype or layer order, or
another seed, raises the same UsageError on every rank within timeout_s (before: an abort in
gloo, a hang in new_group, or models averaged crosswise)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync.comm.side import timeout_of
from dssync.errors import UsageError
from dssync.lab.launch import spawn
from dssync.strategies.waitless import AsyncDSSync

TIMEOUT_S = 15.0


class _Pair(nn.Module):
    def __init__(self, swapped: bool) -> None:
        super().__init__()
        if swapped:  # the same names and shapes, registered in the other order
            self.b = nn.Linear(4, 4)
            self.a = nn.Linear(4, 4)
        else:
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)


def _odd(case: str):
    rank = dist.get_rank()
    model = _Pair(swapped=case == "order" and rank == 1)
    seed = rank if case == "seed" else 0
    if case == "dtype" and rank == 1:
        model = model.to(torch.bfloat16)
    started = time.monotonic()
    try:
        sync = AsyncDSSync(model, seed=seed, timeout_s=TIMEOUT_S)
    except UsageError as e:
        return str(e), time.monotonic() - started
    return None, timeout_of(sync.serving_process_group).total_seconds()


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("dtype", "rank 0 has 4 tensors of 40 elements in float32, a.weight"),
        pytest.param(
            "order",
            "rank 1 has 4 tensors of 40 elements in float32, b.weight, b.bias, a.weight",
            marks=pytest.mark.slow,
        ),
        pytest.param("seed", "rank 0 has Bipartite(seed=0)", marks=pytest.mark.slow),
    ],
)
def test_a_mismatch_is_the_same_usage_error_on_every_rank_within_the_timeout(case, words):
    out = spawn(_odd, 2, args=(case,), timeout_s=120)
    (msg0, took0), (msg1, took1) = out
    assert msg0 is not None and msg0 == msg1, out
    assert words in msg0
    assert "ranks disagree on the" in msg0
    assert max(took0, took1) < TIMEOUT_S


@pytest.mark.slow
def test_no_group_outlives_timeout_s():
    """The serving process group was made with a 3,600 s timeout, so a peer lost while making it hung."""
    (msg0, wire0), (msg1, wire1) = spawn(_odd, 2, args=("none",), timeout_s=120)
    assert msg0 is None and msg1 is None
    assert wire0 == wire1 == TIMEOUT_S
