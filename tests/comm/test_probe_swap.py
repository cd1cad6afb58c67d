"""The probe's swap: both directions in one batch, and a bounded wait that names the lost peer."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from dssync.errors import PeerLost
from dssync.lab.launch import spawn
from dssync.topology.probe import _swap


def _swap_then_lose_a_peer():
    rank = dist.get_rank()
    pg = dist.new_group([0, 1])  # the failed wait breaks this group, not the world's
    out, into = torch.full((4,), float(rank)), torch.empty(4)
    _swap(out, into, 1 - rank, pg, timeout_s=30)
    got = into.tolist()
    if rank == 1:
        time.sleep(4)  # never answers the second swap
        return got, None, 0.0
    t0 = time.monotonic()
    try:
        _swap(out, into, 1, pg, timeout_s=1.5)
    except PeerLost as e:
        return got, (str(e), e.ranks), time.monotonic() - t0
    return got, None, time.monotonic() - t0


def test_swap_exchanges_and_a_silent_peer_raises_in_time():
    (got0, lost, waited), (got1, _, _) = spawn(_swap_then_lose_a_peer, 2, timeout_s=60)
    assert got0 == [1.0] * 4 and got1 == [0.0] * 4
    assert lost is not None, "a peer that never answered did not raise"
    message, ranks = lost
    assert ranks == [1] and "bandwidth probe" in message
    assert waited < 4
