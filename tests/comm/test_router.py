"""Router: which groups it makes (pairs by all_reduce, the cap), and every path averages alike."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dssync.comm.averager import Router
from dssync.comm.tags import STEP
from dssync.schedules import Shuffle, Static, group_of

WORLD = 4


def _average_with(router: Router, schedule, steps: int) -> list[tuple[int, list[int], list]]:
    """Each step: this rank's group and its buffer after averaging rank-distinct values."""
    out = []
    for step in range(steps):
        group = group_of(schedule.partition(step, WORLD), router.rank)
        buf = torch.arange(5, dtype=torch.float32) * (router.rank + 1) + step
        router.average(group, STEP, step, buffers=[buf])
        out.append((step, group, buf.tolist()))
    return out


def _routers() -> dict:
    pairs = Shuffle(2, seed=0)  # never repeats: every pair of the world is made
    cycle3 = Static([[0, 1, 2], [3]], uneven=True)  # one group of three, repeating
    made = {}
    r = Router(None, pairs, pairs="all_reduce")
    made["all_pairs"] = (r.created, sorted(r.groups), _average_with(r, pairs, 6))
    r = Router(None, pairs, pairs="all_reduce", max_groups=4)
    made["capped_pairs"] = (r.created, sorted(r.groups), _average_with(r, pairs, 6))
    r = Router(None, cycle3, max_groups=0)  # capped to none: the group of three goes p2p
    made["capped_three"] = (r.created, sorted(r.groups), _average_with(r, cycle3, 2))
    r = Router(None, cycle3)
    made["three"] = (r.created, sorted(r.groups), _average_with(r, cycle3, 2))
    r = Router(None, pairs, chunk_bytes=8)  # chunks of 2, 2 and 1 floats, two in flight
    made["small_chunks"] = (r.created, sorted(r.groups), _average_with(r, pairs, 6))
    r = Router(None, pairs)  # the default: no group for pairs
    made["exchange"] = (r.created, sorted(r.groups), _average_with(r, pairs, 6))
    made["first_ops_on_nccl"] = _first_ops_as_if_nccl()
    made["batches"] = _batches(pairs, cycle3)
    dist.barrier()
    return made


def _first_ops_as_if_nccl() -> list[str]:
    """The Router on a group that says it is nccl: which operations reach torch, in order."""
    seen: list[str] = []
    real = {n: getattr(dist, n) for n in ("get_backend", "all_reduce", "batch_isend_irecv")}

    def spy(name):
        def call(*args, **kwargs):
            seen.append(name)
            return real[name](*args, **kwargs)

        return call

    from dssync.comm import averager

    dist.get_backend = lambda group=None: dist.Backend.NCCL
    dist.all_reduce, dist.batch_isend_irecv = spy("all_reduce"), spy("batch_isend_irecv")
    check = averager.check_device  # a CPU model on "nccl" is refused; this nccl is pretend
    averager.check_device = lambda backend, device: None
    try:
        r = Router(None, Shuffle(2, seed=0), device=torch.device("cpu"))
        _average_with(r, Shuffle(2, seed=0), 1)
    finally:
        for n, f in real.items():
            setattr(dist, n, f)
        averager.check_device = check
    return seen


def _batches(pairs, cycle3) -> list[list[tuple[str, int]]]:
    """Each batch posted by the transport (a pair, then a group of three) and by the start-up
    probe's swap: (operation, peer) in order."""
    from dssync.topology.probe import _swap

    seen: list[list[tuple[str, int]]] = []
    real = dist.batch_isend_irecv

    def spy(ops):
        seen.append([(op.op.__name__, op.peer) for op in ops])
        return real(ops)

    dist.batch_isend_irecv = spy
    try:
        _average_with(Router(None, pairs, chunk_bytes=8), pairs, 2)
        _average_with(Router(None, cycle3, max_groups=0), cycle3, 1)
        rank = dist.get_rank()
        _swap(torch.ones(3), torch.empty(3), rank ^ 1, dist.group.WORLD, 60.0)
    finally:
        dist.batch_isend_irecv = real
    return seen


def test_groups_made_and_capped_and_every_path_averages():
    from dssync.lab.launch import spawn

    ranks = spawn(_routers, WORLD, timeout_s=120)
    expect_made = {"all_pairs": 6, "capped_pairs": 4, "capped_three": 0, "three": 1, "exchange": 0}
    expect_made["small_chunks"] = 0
    for r in ranks:  # one all_reduce on the parent group before any point-to-point op
        assert r.pop("first_ops_on_nccl")[:2] == ["all_reduce", "batch_isend_irecv"]
    for rank, r in enumerate(ranks):  # each batch receives from a peer before it sends to it
        batches = r.pop("batches")
        assert len(batches) > 4
        assert len(batches[-1]) == 2  # the probe's swap
        if rank in (0, 1, 2):  # the group of three posts to two peers in one batch
            assert any(len({p for _, p in b}) == 2 for b in batches)
        for batch in batches:
            for peer in {p for _, p in batch}:
                kinds = [k for k, p in batch if p == peer]
                if len(kinds) > 1:  # a one-element chunk's empty half leaves one operation
                    want = ["irecv", "isend"] * (len(kinds) // 2)
                    assert kinds == want, f"a send posted before its receive: {batch}"
    for name, made in expect_made.items():
        assert [r[name][0] for r in ranks] == [made] * WORLD, name
    assert len(ranks[0]["all_pairs"][1]) == 3  # rank 0 is in three of the six pairs
    assert ranks[3]["three"][1] == []  # rank 3 is outside the group of three
    for name in expect_made:
        for step_rows in zip(*(r[name][2] for r in ranks), strict=True):
            for step, group, buf in step_rows:
                want = [
                    sum(i * (m + 1) + step for m in group) / len(group) for i in range(len(buf))
                ]
                assert buf == pytest.approx(want, rel=1e-6), (name, step, group)
                peers = [step_rows[m][2] for m in group]
                assert all(p == buf for p in peers), "members differ"  # bit-identical
