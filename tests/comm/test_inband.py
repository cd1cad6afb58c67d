"""A one-chunk pair whose bucket has room after it sends its tag inside the data's message."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dssync.comm.averager import Router
from dssync.comm.buckets import FlatBuckets, room_of
from dssync.comm.tags import STEP
from dssync.errors import SyncError
from dssync.lab.launch import spawn


def _bucket(dtype: torch.dtype, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    tensors = [torch.randn(37, generator=g).to(dtype), torch.randn(3, 5, generator=g).to(dtype)]
    return FlatBuckets(tensors).buffers[0]


def _posts(fn) -> int:
    """How many batches of point-to-point operations ``fn`` posted."""
    real, seen = dist.batch_isend_irecv, []
    dist.batch_isend_irecv = lambda ops: seen.append(len(ops)) or real(ops)
    try:
        fn()
    finally:
        dist.batch_isend_irecv = real
    return len(seen)


def _pair() -> dict:
    rank, out = dist.get_rank(), {}
    pair = sorted([rank, rank ^ 1])  # pairs of a world of four: point to point
    for dtype in (torch.float32, torch.bfloat16):
        roomy = _bucket(dtype, rank)
        plain = roomy.clone()  # the same values, no room after it
        out[f"room {dtype}"] = room_of(roomy) is not None and room_of(plain) is None
        r, posts, arrived = Router(None), [], []
        for b in (roomy, plain):
            posts.append(_posts(lambda b=b, r=r: r.average(pair, STEP, 3, buffers=[b])))
            arrived.append(r.arrived is not None)
        out[f"posts {dtype}"], out[f"arrived {dtype}"] = posts, arrived
        out[f"same bits {dtype}"] = torch.equal(roomy.view(torch.uint8), plain.view(torch.uint8))
        out[f"mean {dtype}"] = roomy.float().tolist()
    kept = Router(None, inband=False)
    b = _bucket(torch.float32, rank)
    out["posts kept apart"] = _posts(lambda: kept.average(pair, STEP, 3, buffers=[b]))
    out["arrived kept apart"] = kept.arrived is not None
    r = Router(None)
    b = _bucket(torch.float32, rank)
    out["posts of a slice"] = _posts(lambda: r.average(pair, STEP, 3, buffers=[b[:40]]))
    b = _bucket(torch.float32, rank)
    before = b.clone()
    try:
        r.average(pair, STEP, 5 + rank, buffers=[b])  # the ranks at different steps
        out["mismatch"] = "no error"
    except SyncError as e:
        out["mismatch"] = str(e)
    out["kept after the mismatch"] = torch.equal(b, before)
    dist.barrier()
    return out


def test_the_tag_rides_in_the_data_and_is_checked_before_use():
    ranks = spawn(_pair, 4, timeout_s=120)
    for dtype in (torch.float32, torch.bfloat16):
        for r in ranks:
            assert r[f"room {dtype}"]
            assert r[f"posts {dtype}"] == [1, 2], "the tag rode apart, or the plain path changed"
            assert r[f"arrived {dtype}"] == [False, True]  # tags and data came as one
            assert r[f"same bits {dtype}"], "the tag in the data changed the mean's bits"
        assert ranks[0][f"mean {dtype}"] == ranks[1][f"mean {dtype}"]
        assert ranks[2][f"mean {dtype}"] == ranks[3][f"mean {dtype}"]
        a, b = (_bucket(dtype, k) for k in (0, 1))
        assert ranks[0][f"mean {dtype}"] == ((a + b) / 2).float().tolist()
    for rank, r in enumerate(ranks):
        assert r["posts kept apart"] == 2 and r["arrived kept apart"]
        assert r["posts of a slice"] == 2  # a slice of a bucket has no room of its own
        assert "ranks out of step" in r["mismatch"], r["mismatch"]
        peer = rank ^ 1
        assert (
            f"rank {peer} sent the schedule's group average at averaging {5 + peer}"
            in r["mismatch"]
        )
        assert r["kept after the mismatch"], "a mismatched peer's bytes were used"
