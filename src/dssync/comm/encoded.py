"""Group averages whose messages travel compressed (:mod:`dssync.comm.wire`).

Every member encodes each buffer with error feedback, sends the message to every other member
and decodes every message, its own included; all then take the mean in group order, so the
members end with the same bits. A pair or a smaller group swaps messages point to point on the
parent group (receives posted first, as :func:`~dssync.comm.exchange.swap_ops`), with the tags
in the same batch; the whole parent group gathers them with ``all_gather``. Each message is
``1/k`` of what a member receives, so a member receives ``k-1`` compressed buffers: int8 pairs
move a quarter of the fp32 bytes; a large group gathering int8 moves ``(k-1)/4`` buffers where
a ring all-reduce of fp32 moves about two.

Tags are checked exactly before any received byte is used; every wait is bounded by the
deadline and a failed one raises :class:`~dssync.errors.PeerLost` (see
:func:`dssync.comm.exchange.wait`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from dssync.comm.exchange import RollCall, swap_ops, wait
from dssync.comm.inflight import lend
from dssync.comm.tags import Tag, check_peers
from dssync.comm.wire import Codec, encode_with_feedback, mean_in_order


def encoded_average(
    buffers: Sequence[torch.Tensor],
    residuals: Sequence[torch.Tensor],
    codec: Codec,
    process_group: dist.ProcessGroup,
    group: list[int],
    tag: Tag,
    timeout_s: float,
    roll: RollCall | None = None,
) -> float:
    """Average ``buffers`` (flat, in place) over ``group`` (ranks of ``process_group``), each
    sent as ``codec`` encodes it with its residual. Returns when every member's tag had come
    (``time.perf_counter``), as :attr:`~dssync.comm.exchange.Exchange.arrived`."""
    deadline = time.monotonic() + timeout_s
    rank = dist.get_rank(process_group)
    sent, mine = [], []
    for b, e in zip(buffers, residuals, strict=True):
        msg, value = encode_with_feedback(codec, b, e)
        sent.append(msg)
        mine.append(value)
    if len(group) == dist.get_world_size(process_group):
        got, arrived = _gathered(sent, buffers, codec, process_group, group, tag, deadline, roll)
    else:
        got, arrived = _swapped(sent, buffers, codec, process_group, group, rank, tag, deadline)
    for i, b in enumerate(buffers):
        values = [
            mine[i] if r == rank else codec.decode(got[r][i], b.numel(), b.dtype) for r in group
        ]
        mean_in_order(values, out=b)  # decoded copies only: b is free to take the sum
    return arrived


def _global(pg: dist.ProcessGroup, r: int) -> int:
    return r if pg in (None, dist.group.WORLD) else dist.get_global_rank(pg, r)


def _swapped(sent, buffers, codec, pg, group, rank, tag, deadline):
    """Messages swapped point to point; returns them and when every peer's tag had come.

    The tags are posted first and waited for first, so what follows them is transfer: timed
    after the data (as it was), a crossing of a slow link looked as quick as a local pair, and a
    re-planning DS-Sync on a compressed wire crossed its bottleneck every step.
    """
    peers = [r for r in group if r != rank]
    device = buffers[0].device if buffers else torch.device("cpu")
    mine = tag.tensor(device)
    tags = {p: torch.empty_like(mine) for p in peers}
    got = {p: [codec.empty(b.numel(), b) for b in buffers] for p in peers}
    heads = []
    for p in peers:
        heads += swap_ops(tags[p], mine, _global(pg, p), pg)
    ops = []
    for p in peers:
        for msg, into in zip(sent, got[p], strict=True):
            for out, theirs in zip(msg, into, strict=True):
                ops += swap_ops(theirs, out, _global(pg, p), pg)
    timeout_s = max(deadline - time.monotonic(), 0.001)
    known = peers if len(peers) == 1 else None
    lend(op.tensor for op in heads + ops)  # held by gloo's threads until they let go (see inflight)
    # two batches, posted in the same order on every member: on a backend that coalesces a batch
    # into one work (nccl) the tags' work still completes before the data's
    tag_works, data_works = dist.batch_isend_irecv(heads), dist.batch_isend_irecv(ops)
    for w in tag_works:
        wait(w, deadline, tag, group, timeout_s, known)
    check_peers(tag, tags, group)
    arrived = time.perf_counter()
    for w in data_works:
        wait(w, deadline, tag, group, timeout_s, known)
    return got, arrived


def _gathered(sent, buffers, codec, pg, group, tag, deadline, roll):
    device = buffers[0].device if buffers else torch.device("cpu")
    mine = tag.tensor(device)
    tags = [torch.empty_like(mine) for _ in group]
    timeout_s = max(deadline - time.monotonic(), 0.001)
    lists = []
    for msg, b in zip(sent, buffers, strict=True):
        for j in range(len(msg)):
            lists.append([codec.empty(b.numel(), b)[j] for _ in group])
    outs = [out for msg in sent for out in msg]
    lend([mine, *tags, *outs, *(t for into in lists for t in into)])  # see inflight
    works = [dist.all_gather(tags, mine, group=pg, async_op=True)]
    for into, out in zip(lists, outs, strict=True):
        works.append(dist.all_gather(into, out, group=pg, async_op=True))
    wait(works[0], deadline, tag, group, timeout_s, roll=roll)
    check_peers(tag, dict(enumerate(tags)), group)
    arrived = time.perf_counter()
    for w in works[1:]:
        wait(w, deadline, tag, group, timeout_s, roll=roll)
    got: dict[int, list[list[torch.Tensor]]] = {r: [] for r in group}
    k = 0
    for msg in sent:
        for r in group:
            got[r].append([lists[k + j][r] for j in range(len(msg))])
        k += len(msg)
    return got, arrived
