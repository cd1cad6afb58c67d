"""Group averages whose messages travel compressed (:mod:`dssync.comm.wire`).

A pair swaps its messages point to point on the parent group (receives posted first, as
:func:`~dssync.comm.exchange.swap_ops`): every member encodes each buffer with error feedback,
decodes its partner's message and its own, and both take the mean in group order, so they end
with the same bits. Each moves one compressed buffer each way: a quarter of the fp32 bytes for
int8. The buffers go in pieces of :data:`PIECE` elements (whole int8 chunks, so the same bits as
one encoding), :data:`WINDOW` in flight: a piece is encoded and sent while earlier ones cross
the link and later ones arrive, as the fp32 exchange's chunks are
(:class:`~dssync.comm.exchange.Exchange`); sent whole after encoding all of it, a pair's
message waited for the whole encoding and then queued megabytes in a shaped link's limiter.

A group of three or more (the whole parent group included: DiLoCo's global average) reduces in
two stages, as a reduce-scatter then an all-gather would, so each member sends and receives
``2(k-1)/k`` compressed buffers, the bytes of a ring all-reduce of them, where gathering every
member's whole message would move ``k-1``:

1. each buffer is cut into ``k`` shares at int8 chunk boundaries (:func:`~dssync.comm.wire.shares`);
   member ``j`` owns share ``j``. Every member encodes every share with its residual (the same
   bits as encoding the whole buffer) and sends share ``j`` to its owner;
2. the owner decodes the ``k`` messages of its share (its own included), takes their mean in
   group order in the buffer's dtype, encodes that mean once more and sends it to every member;
   every member, the owner included, decodes it, so all end with the same bits.

The second encoding loses ``d = mean - Q(mean)`` on every member alike; the owner adds ``k * d``
to its residual for that share, so the sum of parameters and residuals over all ranks is still
unchanged by the average and the next averaging sends what was lost (:mod:`dssync.comm.wire`).

Shares go straight to their owners (all to all), not around a ring: an uplink between two
racks of ``k/2`` carries ``k/4`` compressed buffers each way per stage, where a ring would carry
one. On 8 ranks in two racks, int8 puts 0.57x the bytes of an fp32 ring all-reduce on the
uplink (gathering whole int8 messages put 2.3x); :mod:`dssync.lab.bench.bounds` routes it as such.

Tags are compared exactly on the device (:class:`~dssync.comm.tags.Verdict`); where the host
has the verdict without waiting (the CPU) a "no" stops before any received byte is used, on a
device the caller restores the buffers and residuals it kept. Every wait is bounded by the
deadline and a failed one raises :class:`~dssync.errors.PeerLost` (see
:func:`dssync.comm.exchange.wait`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from dssync.comm.exchange import DEFAULT_CHUNK_BYTES, DEFAULT_WINDOW, RollCall, swap_ops, wait
from dssync.comm.inflight import lend
from dssync.comm.tags import Tag, Verdict
from dssync.comm.wire import (
    CHUNK,
    Codec,
    encode_with_feedback,
    mean_in_order,
    shares,
)

# How a compressed group of three or more averages; `dssync bench` records it with its results.
LARGE_GROUPS = "two-stage"
# A pair's pieces: elements encoded and sent at once (whole int8 chunks; the elements of the fp32
# exchange's chunk), and pieces in flight at once.
PIECE = max((DEFAULT_CHUNK_BYTES // 4) // CHUNK, 1) * CHUNK
WINDOW = DEFAULT_WINDOW


def encoded_average(
    buffers: Sequence[torch.Tensor],
    residuals: Sequence[torch.Tensor],
    codec: Codec | Sequence[Codec],
    process_group: dist.ProcessGroup,
    group: list[int],
    tag: Tag,
    timeout_s: float,
    roll: RollCall | None = None,
    finite: torch.Tensor | None = None,
) -> tuple[float, Verdict]:
    """Average ``buffers`` (flat, in place) over ``group`` (ranks of ``process_group``), each
    sent as ``codec`` encodes it with its residual (one codec, or one per buffer: optimizer
    state whose range int8 cannot keep travels in another). Returns when every member's tag
    had come (``time.perf_counter``), as :attr:`~dssync.comm.exchange.Exchange.arrived`, and the
    :class:`~dssync.comm.tags.Verdict` (``finite``: this rank's flag for its tag)."""
    deadline = time.monotonic() + timeout_s
    rank = dist.get_rank(process_group)
    codecs = [codec] * len(buffers) if isinstance(codec, Codec) else list(codec)
    if len(group) > 2:
        return _two_stage(
            buffers, residuals, codecs, process_group, group, rank, tag, deadline, roll, finite
        )
    return _pair(buffers, residuals, codecs, process_group, group, rank, tag, deadline, finite)


def _pieces(buffers: Sequence[torch.Tensor]) -> list[tuple[int, int, int]]:
    """``(buffer index, lo, hi)`` of each piece a pair encodes and sends at once, in order."""
    return [
        (i, lo, min(lo + PIECE, b.numel()))
        for i, b in enumerate(buffers)
        for lo in range(0, b.numel(), PIECE)
    ]


def _pair(buffers, residuals, codecs, pg, group, rank, tag, deadline, finite=None):
    """Two ranks: each piece encoded, swapped and averaged in turn (module docstring).

    At most :data:`WINDOW` pieces are in flight: piece c+WINDOW is encoded and posted when piece
    c has arrived, before c is decoded, in the same order on both ranks (so the messages match),
    so encoding the next pieces runs while earlier ones cross the link. Pieces are whole int8
    chunks, so the bits are those of encoding each buffer at once. A peer lost midway leaves the
    pieces before it averaged and the rest as they were (as the fp32 exchange does).
    """
    peer = group[0] if group[1] == rank else group[1]
    g = _global(pg, peer)
    device = buffers[0].device if buffers else torch.device("cpu")
    sent, tags, heads = _tag_ops(tag, [peer], pg, device, finite)
    pieces = _pieces(buffers)

    def post(c: int) -> tuple:
        i, lo, hi = pieces[c]
        b = buffers[i]
        msg, mine = encode_with_feedback(codecs[i], b[lo:hi], residuals[i][lo:hi])
        into = codecs[i].empty(hi - lo, b)
        ops = [
            op for out, theirs in zip(msg, into, strict=True) for op in swap_ops(theirs, out, g, pg)
        ]
        return _post(ops), mine, into

    timeout_s = max(deadline - time.monotonic(), 0.001)
    tag_works = _post(heads)
    ahead = [post(c) for c in range(min(WINDOW, len(pieces)))]
    for w in tag_works:
        wait(w, deadline, tag, group, timeout_s, [peer], process_group=pg)
    verdict = Verdict.of_peers(tag, sent, tags, group, rank)
    arrived = time.perf_counter()
    if verdict.known() is False:  # both see the same tags: both keep their own values
        for works, _, _ in ahead:
            for w in works:
                wait(w, deadline, tag, group, timeout_s, [peer], came=True, process_group=pg)
        return arrived, verdict
    for c, (i, lo, hi) in enumerate(pieces):
        works, mine, into = ahead[c]
        for w in works:  # the peer came (its tag was checked): a failure now is mid-transfer
            wait(w, deadline, tag, group, timeout_s, [peer], came=True, process_group=pg)
        if c + WINDOW < len(pieces):
            ahead.append(post(c + WINDOW))
        ahead[c] = None  # its buffers go as soon as they are used
        b = buffers[i]
        theirs = codecs[i].decode(into, hi - lo, b.dtype)
        # decoded copies only: the piece, encoded already, is free to take the mean
        mean_in_order([mine, theirs] if rank == group[0] else [theirs, mine], out=b[lo:hi])
    return arrived, verdict


def _global(pg: dist.ProcessGroup, r: int) -> int:
    return r if pg in (None, dist.group.WORLD) else dist.get_global_rank(pg, r)


def _tag_ops(tag, peers, pg, device, finite=None):
    mine = tag.tensor(device, finite)
    tags = {p: torch.empty_like(mine) for p in peers}
    ops = []
    for p in peers:
        ops += swap_ops(tags[p], mine, _global(pg, p), pg)
    return mine, tags, ops


def _post(ops: list[dist.P2POp]) -> list:
    """Post ``ops`` as one batch (empty tensors left out: both sides know the sizes alike)."""
    ops = [op for op in ops if op.tensor.numel()]
    if not ops:
        return []
    lend(op.tensor for op in ops)  # held by gloo's threads until they let go (see inflight)
    return dist.batch_isend_irecv(ops)


def _two_stage(buffers, residuals, codecs, pg, group, rank, tag, deadline, roll, finite=None):
    """A group of three or more: shares to their owners, owners' means back (module docstring)."""
    k, me = len(group), group.index(rank)
    peers = [r for r in group if r != rank]
    device = buffers[0].device if buffers else torch.device("cpu")
    cuts = [shares(b.numel(), k) for b in buffers]
    sent, mine = [], []  # sent[i][j]: buffer i's share j as it travels; mine[i]: my share decoded
    for b, e, cut, codec in zip(buffers, residuals, cuts, codecs, strict=True):
        msgs = [encode_with_feedback(codec, b[lo:hi], e[lo:hi]) for lo, hi in cut]
        sent.append([msg for msg, _ in msgs])
        mine.append(msgs[me][1])
    size = [[hi - lo for lo, hi in cut] for cut in cuts]  # size[i][j]: buffer i's share j
    sent_tag, tags, heads = _tag_ops(tag, peers, pg, device, finite)
    got = {p: [codecs[i].empty(size[i][me], b) for i, b in enumerate(buffers)] for p in peers}
    ops = []
    for p in peers:
        j = group.index(p)
        for i in range(len(buffers)):
            for out, theirs in zip(sent[i][j], got[p][i], strict=True):
                ops += swap_ops(theirs, out, _global(pg, p), pg)
    timeout_s = max(deadline - time.monotonic(), 0.001)
    known = peers if len(peers) == 1 else None
    tag_works, share_works = _post(heads), _post(ops)
    for w in tag_works:
        wait(w, deadline, tag, group, timeout_s, known, roll, process_group=pg)
    verdict = Verdict.of_peers(tag, sent_tag, tags, group, rank)
    arrived = time.perf_counter()
    for w in share_works:
        wait(w, deadline, tag, group, timeout_s, known, roll, process_group=pg)
    if verdict.known() is False:  # every member sees the same tags: all keep their own values
        return arrived, verdict
    means = []  # my share's mean of each buffer, as it travels back
    for i, (b, e) in enumerate(zip(buffers, residuals, strict=True)):
        lo, hi = cuts[i][me]
        own, codec = b[lo:hi], codecs[i]
        values = [
            mine[i] if r == rank else codec.decode(got[r][i], hi - lo, b.dtype) for r in group
        ]
        mean_in_order(values, out=own)  # decoded copies only: the share is free to take it
        msg, back = codec.encode_decoded(own)  # own is overwritten below
        e[lo:hi].add_(own - back, alpha=k)  # what every member loses now, sent again next time
        own.copy_(back)
        means.append(msg)
    back_in = {
        p: [codecs[i].empty(size[i][group.index(p)], b) for i, b in enumerate(buffers)]
        for p in peers
    }
    ops = []
    for p in peers:
        for i in range(len(buffers)):
            for out, theirs in zip(means[i], back_in[p][i], strict=True):
                ops += swap_ops(theirs, out, _global(pg, p), pg)
    for w in _post(ops):
        wait(w, deadline, tag, group, timeout_s, known, roll, process_group=pg)
    for p in peers:
        j = group.index(p)
        for i, b in enumerate(buffers):
            lo, hi = cuts[i][j]
            b[lo:hi].copy_(codecs[i].decode(back_in[p][i], hi - lo, b.dtype))
    return arrived, verdict
