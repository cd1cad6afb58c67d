"""Metadata from one rank to all: the first rank's object reaches every rank (its deadline is
:func:`dssync.comm.meta.bounded`'s, tested in test_bounded_start.py)."""

from __future__ import annotations

import torch.distributed as dist

from dssync.comm.meta import from_first
from dssync.lab.launch import spawn


def _share() -> object:
    mine = {"pick": "dssync-topo-local", "every": 16} if dist.get_rank() == 0 else ["ignored"]
    return from_first(mine, None, timeout_s=30, what="a test's object")


def test_every_rank_gets_the_first_ranks_object():
    assert spawn(_share, 3, timeout_s=120) == [{"pick": "dssync-topo-local", "every": 16}] * 3
