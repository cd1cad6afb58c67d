"""The one transport: on NCCL's rules one batch per phase, on gloo the chunk window; the same
bits either way, equal to the mean taken in group order, on every member."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dssync.comm.tags import STEP, Tag, layout_of
from dssync.comm.transport import Transport
from dssync.comm.wire import BLOCK, Residuals, codec_for
from dssync.lab.launch import spawn

WORLD = 3
NUMEL = (5 * BLOCK + 7, 3 * BLOCK)  # two buffers, several 4 KB chunks each, one odd tail


def _buffers(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return [torch.randn(n, generator=g) for n in NUMEL]


def _average(group: list[int], wire: str) -> tuple[list[torch.Tensor], int]:
    """This rank's buffers after one average with ``group`` (chunks of 4 KB), and the batches
    posted for it."""
    posted, real = [], dist.batch_isend_irecv

    def spy(ops):
        posted.append(len(ops))
        return real(ops)

    buffers = _buffers(dist.get_rank())
    codec = codec_for(wire)
    residuals = Residuals().like(buffers) if wire != "fp32" else []
    t = Transport(None, chunk_bytes=4 * BLOCK, window=2)
    dist.batch_isend_irecv = spy
    try:
        if dist.get_rank() in group:
            tag = Tag(STEP, 1, layout_of(buffers))
            t.average(buffers, group, tag, 30.0, codecs=[codec] * 2, residuals=residuals)
    finally:
        dist.batch_isend_irecv = real
    return buffers, len(posted)


CASES = [([0, 2], "fp32"), ([0, 1, 2], "fp32"), ([2, 0, 1], "fp32"), ([0, 1, 2], "int8")]


def _both() -> dict:
    from dssync.testing import use_nccl_like_world

    on_gloo = {i: _average(g, w) for i, (g, w) in enumerate(CASES)}
    use_nccl_like_world(timeout_s=60)
    dist.all_reduce(torch.zeros(1))  # NCCL's rule: a collective before any point-to-point op
    on_like = {i: _average(g, w) for i, (g, w) in enumerate(CASES)}
    return {"gloo": on_gloo, "like": on_like}


@pytest.mark.slow  # 70 s on the loaded 2-core machine (two worlds, four cases)
@pytest.mark.timeout(200)
def test_one_batch_per_phase_on_nccl_like_the_window_on_gloo_the_same_bits():
    out = spawn(_both, WORLD, timeout_s=180)
    for i, (group, wire) in enumerate(CASES):
        for r in group:
            gloo, gloo_batches = out[r]["gloo"][i]
            like, like_batches = out[r]["like"][i]
            assert like_batches == (2 if wire != "fp32" and len(group) == 2 else 3), (i, r)
            assert gloo_batches > like_batches, (i, r)  # a batch per chunk and phase
            for a, b, first in zip(gloo, like, out[group[0]]["like"][i][0], strict=True):
                assert torch.equal(a, b), f"case {i}: rank {r} differs between gloo and nccl_like"
                assert torch.equal(b, first), f"case {i}: rank {r} differs from rank {group[0]}"
        if wire == "fp32":  # the mean in group order, as one process computes it
            for j, mean in enumerate(out[group[0]]["gloo"][i][0]):
                total = _buffers(group[0])[j]
                for m in group[1:]:
                    total = total + _buffers(m)[j]
                assert torch.equal(mean, total / len(group)), (i, j)
        for r in set(range(WORLD)) - set(group):  # outsiders keep their own
            assert all(
                torch.equal(a, b) for a, b in zip(out[r]["like"][i][0], _buffers(r), strict=True)
            )
