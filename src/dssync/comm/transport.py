"""The one transport: a single routine averages flat buffers inside a group of ranks.

:meth:`Transport.average` takes flat buffers on the parameters' device, the group (ranks of one
parent group), a :class:`~dssync.comm.tags.Tag`, a deadline, and optionally one codec per
buffer with its residual (:mod:`dssync.comm.wire`; fp32 is the identity and costs no copy). It
serves pairs, groups of any size, the global average, the compressed wires and the overlap lane
(all through :class:`~dssync.comm.averager.Router`), and leaves every member with bit-identical
buffers, or raises :class:`~dssync.errors.PeerLost` by the deadline.

Point to point (no process group is made): each buffer is cut into pieces (whole int8 blocks of
about ``chunk_bytes``), each piece into ``k`` shares, one per member in group order (whole int8
blocks, :func:`~dssync.comm.wire.shares`; in fp32 as even as they go):

1. every member sends share ``j`` to its owner ``j`` (encoded with its residual on a lossy wire);
   the owner takes the mean of the ``k`` values in group order; on a lossy wire it encodes that
   mean once more and adds ``k * (mean - Q(mean))`` to its residual for that share, so the sum of
   parameters and residuals over the ranks is unchanged by the average;
2. the owner sends its mean to every member, which takes it in place (decoded on a lossy wire).

Each member sends and receives ``2(k-1)/k`` buffers, the bytes of a ring all-reduce, and adds
only its own share; for a pair in fp32 this is a two-rank all-reduce (each rank averages half of
every piece and sends it back). Two cases, each justified by a measurement, take one round trip
instead, every member sending its whole piece to every other and all taking the mean of the same
values in group order (IEEE addition commutes, so a pair's two members hold the same bits):

* a pair whose buffers make one ``chunk_bytes`` chunk in all: no other piece could hide the
  second round trip (``tools/exchange_window.py``); one such buffer with room after it (a bucket
  of :class:`~dssync.comm.buckets.FlatBuckets`) carries the tag at the end of the data's own
  message (:meth:`Transport._tagged`): at 1M parameters a step cost 1.04-1.10x of a raw exchange
  against 1.14-1.25x with the tag apart (``dssync bench-sync``,
  docs/results/bench-sync/loopback-4-tag-*.json);
* a pair on a lossy wire: the same bytes as the two phases (one compressed buffer each way), one
  round trip, and no second encoding, whose loss would double the bound on the mean's drift
  (``tests/comm/test_wire.py``: one encoding's error, half an int8 step, not two).

How the pieces go depends on the backend (``dist.get_backend``). On gloo at most ``window``
pieces are in their first phase at once, each its own ``batch_isend_irecv``: a whole buffer
posted both ways at once queued megabytes in a shaped link's rate limiter and ran well behind an
all_reduce pair (figures at :data:`DEFAULT_CHUNK_BYTES`). On NCCL (and the ``nccl_like`` test
backend) a piece is a whole buffer and each phase is one batch for all buffers and peers: NCCL
pipelines a buffer itself, and a batch per 4 MB chunk was about 2,000 launches per averaging at
1B parameters. The cut changes no bit: sums are per element in group order, encodings per int8
chunk.

Tags travel first, one swap with every peer, and are compared exactly on the device
(:class:`~dssync.comm.tags.Verdict`). Where the host has the verdict without waiting (the CPU) a
"no" (tags that differ, a member not finite) stops before anything received is used: buffers
keep their values (the caller restores residuals, which encoding changed). On a device the
caller restores both with ``torch.where`` (:class:`~dssync.comm.averager.Router`).

Every swap posts its receive before its send (:func:`~dssync.comm.exchange.swap_ops`), and every
wait is :func:`dssync.comm.exchange.wait` (the one bounded wait, naming the peer).

With ``collective=`` (a process group over exactly the group's ranks: the parent itself, or one
the Router made for a repeating schedule) and fp32, the buffers are divided by ``k`` and
all-reduced instead, as PyTorch's ``model_averaging.utils.average_parameters`` does, with the tag
all-reduced beside them.

Example::

    t = Transport(parent_pg)
    t.average(buffers, group=[0, 3], tag=Tag(STEP, 7, layout_of(buffers)), timeout_s=60)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from dssync.comm.buckets import DEFAULT_BUCKET_BYTES, ROOM_BYTES, pack, room_of, unpack
from dssync.comm.exchange import RollCall, swap_ops, wait
from dssync.comm.inflight import lend
from dssync.comm.tags import ALL, Tag, Verdict, layout_of, reads_free
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.comm.wire import BLOCK, Codec, codec_for, encode_with_feedback, shares
from dssync.errors import SyncError

# Measured with `dssync bench` (4M parameters, 8 workers; DS-Sync over all_reduce pairs in the
# same run): whole 16 MB buffers 1.03x / 1.36x / 1.86x in S1 / S2 / S3, 2 MB chunks with 2 in
# flight 1.31x / 1.05x / 1.08x, 1 MB chunks with 4 in flight 1.19x / 1.04x / 0.88x, 4 MB chunks
# with 2 in flight 1.06x / 1.10x / 1.14x. Small chunks help random pairs on slow links but cost
# on fast ones: topology-aware DS-Sync training on S2 (its pairs mostly on 1 Gbit/s links) synced
# in 357 ms per step with 1 MB chunks, 249 ms with 16 MB and 257 ms with 4 MB. 4 MB is the
# compromise: within 1.15x of all_reduce pairs on all three. (gloo; on NCCL a piece is a buffer.)
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
# Pieces in their first phase at once on gloo. With 2, a pair's step on loopback cost 1.15x a
# raw whole-buffer exchange at 16M parameters (the pipeline drained between chunks); with 4,
# 1.01x, and the emulated clusters' iterations stayed as they were (`dssync bench`, 4M
# parameters, S1-S3, window 2 and 4 twice each, 2026-12-05: docs/bench.md).
DEFAULT_WINDOW = 4  # chunks in flight per peer on gloo (the one window: a count of chunks)
# How a compressed group of three or more averages; `dssync bench` records it with its results.
LARGE_GROUPS = "two-stage"
FP32 = codec_for("fp32")


class Transport:
    """Group averages of flat buffers on one parent group (module docstring).

    ``group`` ranks are ranks of ``process_group``. Receive buffers are kept between calls.
    ``chunk_bytes`` and ``window`` shape the pieces on gloo; ``inband=False`` keeps a one-chunk
    pair's tag apart from its data.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        window: int = DEFAULT_WINDOW,
        inband: bool = True,
    ) -> None:
        self.parent = process_group if process_group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.parent)
        self.chunk_bytes = chunk_bytes
        self.window = max(int(window), 1)
        self.inband = inband
        # NCCL and the like pipeline a whole buffer: one batch per phase
        self.batched = dist.get_backend(self.parent) != dist.Backend.GLOO
        self._recv: dict[tuple, torch.Tensor] = {}

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.parent, r) if self.parent is not dist.group.WORLD else r

    def _scratch(self, key: tuple, b: torch.Tensor) -> torch.Tensor:
        """A receive buffer shaped like flat ``b``: a view of one kept per key, grown only when
        ``b`` is larger (a slice of the model after the whole, or back, reuses it)."""
        have = self._recv.get(key)
        if (
            have is None
            or have.numel() < b.numel()
            or (have.dtype, have.device)
            != (
                b.dtype,
                b.device,
            )
        ):
            have = self._recv[key] = torch.empty(b.numel(), dtype=b.dtype, device=b.device)
        return have[: b.numel()]

    def _pieces(self, buffers: Sequence[torch.Tensor], lossy: bool) -> list[tuple[int, int, int]]:
        """``(buffer index, lo, hi)`` of each piece on gloo, in order (whole int8 blocks)."""
        step = max(self.chunk_bytes // 4 // BLOCK, 1) * BLOCK if lossy else None
        out = []
        for i, b in enumerate(buffers):
            size = step or max(self.chunk_bytes // b.element_size(), 1)
            out += [(i, lo, min(lo + size, b.numel())) for lo in range(0, b.numel(), size)]
        return out

    def average(
        self,
        buffers: Sequence[torch.Tensor],
        group: list[int],
        tag: Tag,
        timeout_s: float,
        finite: torch.Tensor | None = None,
        codecs: Sequence[Codec] | None = None,
        residuals: Sequence[torch.Tensor] = (),
        collective: dist.ProcessGroup | None = None,
        roll: RollCall | None = None,
    ) -> tuple[float | None, Verdict | None]:
        """Average ``buffers`` (flat, in place) with ``group``; returns when every member's tag
        had come (``time.perf_counter``; None when the tag rode in the data) and the verdict
        (None: nothing to average).

        ``finite``: this rank's finite flag for its tag (:func:`~dssync.comm.tags.finite_of`;
        default: finite). ``codecs``/``residuals``: one codec per buffer and its residual (error
        feedback); without residuals the buffers travel in fp32, whatever ``codecs`` says. ``collective``: a process group over
        exactly ``group`` to all-reduce on (fp32 only). ``roll``: finds who never came to a
        failed collective."""
        deadline = time.monotonic() + timeout_s
        if collective is not None and not residuals:
            return self._collective(buffers, collective, group, tag, timeout_s, roll, finite)
        if len(group) < 2:
            return None, None
        codecs = list(codecs) if residuals and codecs is not None else [FP32] * len(buffers)
        return self._p2p(buffers, group, tag, deadline, timeout_s, finite, codecs, residuals)

    def _post(self, ops: list[dist.P2POp]) -> list[tuple[object, list[int]]]:
        """Post ``ops`` as one batch (empty tensors left out: both sides know the sizes alike);
        each work with the peers it waits on."""
        ops = [op for op in ops if op.tensor.numel() > 0]
        if not ops:
            return []
        works = dist.batch_isend_irecv(ops)
        if len(works) != len(ops):  # a backend that coalesces the batch (nccl): all its peers
            peers = sorted({op.peer for op in ops})
            return [(w, peers) for w in works]
        return [(w, [op.peer]) for w, op in zip(works, ops, strict=True)]

    def _p2p(self, buffers, group, tag, deadline, timeout_s, finite, codecs, residuals):
        k, rank = len(group), self.rank
        me = group.index(rank)
        peers = [r for r in group if r != rank]
        lossy = bool(residuals)
        chunked = self._pieces(buffers, lossy)
        whole = k == 2 and (lossy or len(chunked) == 1)
        local = {self._global(p): p for p in peers}  # global rank -> group rank, for messages
        came = False

        def done(works: list) -> None:
            for w, ps in works:
                named = [local.get(p, p) for p in ps]
                wait(
                    w, deadline, tag, group, timeout_s, named, came=came, process_group=self.parent
                )

        if not lossy and whole and self.inband and len(buffers) == 1:
            room = room_of(buffers[0])
            if room is not None:
                return self._tagged(buffers[0], room, group, peers[0], tag, done, finite)
        pieces = [(i, 0, b.numel()) for i, b in enumerate(buffers)] if self.batched else chunked
        device = buffers[0].device if buffers else torch.device("cpu")
        mine = tag.tensor(device, finite)
        tags = {p: torch.empty_like(mine) for p in peers}
        head = self._post(
            [op for p in peers for op in swap_ops(tags[p], mine, self._global(p), self.parent)]
        )
        state: dict[int, tuple] = {}

        def cuts(lo: int, hi: int) -> list[tuple[int, int]]:
            if whole:
                return [(lo, hi)] * k
            if lossy:
                return [(lo + a, lo + z) for a, z in shares(hi - lo, k)]
            n = hi - lo
            return [(lo + n * j // k, lo + n * (j + 1) // k) for j in range(k)]

        def phase1(c: int) -> list[dist.P2POp]:
            """Send each owner its share (all of it when whole); receive mine from each peer."""
            i, lo, hi = pieces[c]
            b, codec, cut = buffers[i], codecs[i], cuts(lo, hi)
            a, z = cut[me]
            if lossy:
                e = residuals[i]
                sent = [
                    encode_with_feedback(codec, b[x:y], e[x:y]) for x, y in cut[: 1 if whole else k]
                ]
                msgs = [m for m, _ in sent] * (k if whole else 1)
                own = sent[0 if whole else me][1]  # my value of my share, decoded
                got = {p: codec.empty(z - a, b) for p in peers}
            else:
                msgs = [[b[x:y]] for x, y in cut]
                own = b[a:z]
                got = {p: [self._scratch((peers.index(p), i), b)[a:z]] for p in peers}
            state[c] = (b, codec, cut, own, got)
            ops = []
            for p in peers:
                j = group.index(p)
                for out, into in zip(msgs[j], got[p], strict=True):
                    ops += swap_ops(into, out, self._global(p), self.parent)
            return ops

        def reduce(c: int) -> list[dist.P2POp]:
            """The mean of my share in group order; the ops that send it to every member."""
            b, codec, cut, own, got = state[c]
            a, z = cut[me]
            values = [own if r == rank else codec.decode(got[r], z - a, b.dtype) for r in group]
            _mean_into(values, b[a:z])
            if whole:
                state[c] = None
                return []
            if lossy:
                i = pieces[c][0]
                msg, back = codec.encode_decoded(b[a:z])
                residuals[i][a:z].add_(b[a:z] - back, alpha=k)  # what every member loses now
                b[a:z].copy_(back)
                into = {
                    p: codec.empty(cut[group.index(p)][1] - cut[group.index(p)][0], b)
                    for p in peers
                }
            else:
                msg = [b[a:z]]
                into = {p: [b[slice(*cut[group.index(p)])]] for p in peers}  # straight in place
            state[c] = (b, codec, cut, into) if lossy else None
            return [
                op
                for p in peers
                for m, t in zip(msg, into[p], strict=True)
                for op in swap_ops(t, m, self._global(p), self.parent)
            ]

        units = [list(range(len(pieces)))] if self.batched else [[c] for c in range(len(pieces))]

        def first(u: list[int]) -> list:
            return self._post([op for c in u for op in phase1(c)])

        ahead = [first(u) for u in units[: self.window]]
        done(head)
        verdict = Verdict.of_peers(tag, mine, tags, group, rank)
        arrived = time.perf_counter()
        came = True  # every member's tag came: a failure now is mid-transfer
        if verdict.known() is False:  # all members see the same tags: all keep their own
            for works in ahead:
                done(works)
            return arrived, verdict
        back = []
        for n, u in enumerate(units):
            done(ahead[n])  # my sends of this unit left (free to overwrite); my shares arrived
            ahead[n] = None
            if whole and n + self.window < len(units):  # encode the next while this one sums
                ahead.append(first(units[n + self.window]))
            back += self._post([op for c in u for op in reduce(c)])
            if not whole and n + self.window < len(units):
                ahead.append(first(units[n + self.window]))
        done(back)
        for c in range(len(pieces)):  # a lossy wire's means arrived encoded: decode in place
            if state.get(c) is not None:
                b, codec, cut, into = state[c]
                for p in peers:
                    x, y = cut[group.index(p)]
                    b[x:y].copy_(codec.decode(into[p], y - x, b.dtype))
        return arrived, verdict

    def _tagged(self, b, room, group, peer, tag, done, finite=None):
        """A one-chunk pair whose buffer has room after it (:func:`~dssync.comm.buckets.room_of`):
        the tag is written into that room and swapped with the data in one message each way,
        and checked before any received byte is used.

        Both ranks must take this path alike: ``DSSync`` buckets agree across ranks (their
        layout is checked at start-up), and so does ``inband`` (from ``replan``). Buffers of
        different sizes are not caught by the tag on either path, as the data is posted before
        the tags are checked: gloo aborts the process that receives the longer message
        (``gloo::EnforceNotMet``, seen with the tag apart too), and on nccl they are undefined."""
        n = b.numel()
        mine = tag.tensor(b.device, finite)
        room[n:].view(torch.uint8)[:ROOM_BYTES].copy_(mine.view(torch.uint8))
        recv = self._scratch((1, 0), room)
        recv[n:].zero_()  # a shorter message from a peer of another layout reads as no tag
        done(self._post(swap_ops(recv, room, self._global(peer), self.parent)))
        theirs = recv[n:].view(torch.uint8)[:ROOM_BYTES].clone().view(torch.int64)
        verdict = Verdict.of_peers(tag, mine, {peer: theirs}, group, self.rank)
        if verdict.known() is not False:
            b.add_(recv[:n]).div_(2)
        return None, verdict

    def _collective(self, buffers, pg, group, tag, timeout_s, roll, finite):
        """Divide, then all-reduce on ``pg`` (every member of ``group``), the tag first.

        Where the host reads the verdict at no cost (the CPU), the tags' all-reduce is waited
        for first and a "no" returns before any buffer is touched: a copy to restore would cost
        more than the tag's round trip (``dssync bench-sync --workers 2 --params 16000000``: a
        step of 63.7 ms with the copy, 41.6 ms without; all_reduce and divide 39.4-39.8 ms). On a
        device the buffers are divided and reduced beside the tags whatever the verdict says:
        the caller keeps their values to restore (:class:`~dssync.comm.averager.Router`)."""
        deadline = time.monotonic() + timeout_s
        if roll is not None and tag.kind == ALL:  # a rare average: say "I came" first (one
            roll = roll.arrive(group, tag)  # store key each), so a waiting member is not named
        device = buffers[0].device if buffers else torch.device("cpu")
        me = dist.get_rank(pg)
        # this rank's tag as [t, -t], then one slot per member: 1 where that member is not finite
        bad = torch.zeros(len(group), dtype=torch.int64, device=device)
        if finite is not None:
            bad[me].copy_(1 - finite)
        signed = torch.cat([tag.signed(device, finite), bad])
        sent = signed.clone()
        lend([signed, *buffers])
        works = [dist.all_reduce(signed, op=dist.ReduceOp.MAX, group=pg, async_op=True)]
        first = reads_free(device)  # the verdict before the data: on a "no" nothing moved
        if first:
            wait(works[0], deadline, tag, group, timeout_s, roll=roll, process_group=pg)
            verdict = Verdict.of_signed(tag, sent, signed, group, group[me])
            arrived = time.perf_counter()
            if verdict.known() is False:  # every member read the same reduced tags: all stop
                return arrived, verdict
        for b in buffers:
            b.div_(len(group))
            works.append(dist.all_reduce(b, group=pg, async_op=True))
        if not first:
            wait(works[0], deadline, tag, group, timeout_s, roll=roll, process_group=pg)
            verdict = Verdict.of_signed(tag, sent, signed, group, group[me])
            arrived = time.perf_counter()
        for w in works[1:]:
            wait(w, deadline, tag, group, timeout_s, roll=roll, came=True, process_group=pg)
        return arrived, verdict


def _mean_into(values: list[torch.Tensor], out: torch.Tensor) -> None:
    """The mean of ``values`` summed in the order given, written to ``out``: the bits of
    :func:`~dssync.comm.wire.mean_in_order` with no temporary. ``out`` may share memory with
    any one value (each value is read before ``out`` is written); ``values[0]`` is overwritten."""
    total = values[0]
    for v in values[1:-1]:
        total.add_(v)
    torch.add(total, values[-1], out=out).div_(len(values))


def average_tensors(
    tensors: Sequence[torch.Tensor],
    group: dist.ProcessGroup | None,
    group_size: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> float:
    """Average ``tensors`` over every rank of ``group``: pack, reduce, unpack (tagged, bounded;
    a rank missing past ``timeout_s`` is named). Returns when every member had come
    (``time.perf_counter``)."""
    flats = pack(tensors, bucket_bytes)
    buffers = [f for f, _ in flats]
    members = list(range(group_size))
    tag = Tag(ALL, -1, layout_of(buffers))
    saved = [b.clone() for b in buffers]
    pg = group if group is not None else dist.group.WORLD
    arrived, verdict = Transport(pg).average(
        buffers, members, tag, timeout_s, collective=pg, roll=RollCall(group)
    )
    if not verdict.ok():  # off the averaging path: read at once
        for b, s in zip(buffers, saved, strict=True):
            b.copy_(s)
        raise verdict.out_of_step() or SyncError(
            f"non-finite values in {tag.describe()} in group {members}: the ranks kept their own",
            step=tag.index,
            group=members,
        )
    unpack(flats)
    return arrived
