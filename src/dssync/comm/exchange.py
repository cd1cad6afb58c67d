"""How bytes move for one group average: point-to-point exchange, or a collective on a made group.

Both paths take flat buffers on the parameters' device, a :class:`~dssync.comm.tags.Tag`, and a
deadline; both leave every member with bit-identical buffers (the group mean) or raise.

* :class:`Exchange` averages a group of ranks of one parent group by ``dist.batch_isend_irecv``
  on that parent group, so no process group is ever created for it. Buffers are cut into chunks
  of ``chunk_bytes``, combined in order as they arrive, so the link stays busy while an earlier
  chunk is summed. A pair works like a two-rank all_reduce: each rank sends the half of a chunk
  its peer owns, averages the half it owns, and sends that back; bytes per direction equal a
  whole-buffer exchange, each rank adds only half, and both hold the same bits (buffers of
  one chunk in all are swapped whole and summed by both, whose sums commute: one round trip,
  not two). A pair keeps only ``window`` chunks in that first phase at a time: a whole buffer posted both ways at once
  queued megabytes in the rate limiter of a shaped link, and on the emulated cluster's slow
  links such a pair ran well behind an all_reduce pair (figures at ``DEFAULT_CHUNK_BYTES``).
  A larger group swaps whole chunks with every member and each member sums them in group
  order, so all compute the same floating-point sum; it moves k-1 buffers per member and is
  meant for small groups of a schedule that never repeats. Tags are compared exactly on the
  device (:class:`~dssync.comm.tags.Verdict`); a pair whose one buffer is one chunk with room
  after it (a bucket of :class:`~dssync.comm.buckets.FlatBuckets`) sends its tag at the end of
  the data's own message. Where the host has the verdict without waiting (the CPU) a "no"
  leaves every buffer as it was; on a device the caller restores them on the device
  (:class:`~dssync.comm.averager.Router`), so a wrong tag or a non-finite sender is never
  averaged in either way.
* Every swap posts its receive before its send (:func:`swap_ops`). On gloo a send leaves only
  once the peer has said its receive is posted, and that notice travels on the same connection
  as data: posted after a send that could already go, it waited behind that send's bytes, and
  the two directions of a pair often ran one after the other (README, "Receives posted first").
* :func:`collective_average` divides each buffer by the group size and all-reduces it (exactly as
  PyTorch's ``model_averaging.utils.average_parameters``), with the tag all-reduced beside it.

Every wait is bounded by the deadline; a wait that fails or expires raises
:class:`~dssync.errors.PeerLost` naming the step, the group and, for an exchange, the peer that
never answered. Failures are recognised by where they happen (the wait of our own operation), not
by the words of the message.

Example::

    ex = Exchange(parent_pg)
    ex.average(buffers, group=[0, 3], tag=Tag(STEP, 7, layout_of(buffers)), timeout_s=60)
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from dssync.comm.buckets import DEFAULT_BUCKET_BYTES, ROOM_BYTES, pack, room_of, unpack
from dssync.comm.inflight import lend
from dssync.comm.tags import ALL, BROADCAST, Tag, Verdict, layout_of
from dssync.comm.wait import WaitFailed, wait_for
from dssync.errors import PeerLost, SyncError

# Measured with `dssync bench` (4M parameters, 8 workers; DS-Sync over all_reduce pairs in the
# same run): whole 16 MB buffers 1.03x / 1.36x / 1.86x in S1 / S2 / S3, 2 MB chunks with 2 in
# flight 1.31x / 1.05x / 1.08x, 1 MB chunks with 4 in flight 1.19x / 1.04x / 0.88x, 4 MB chunks
# with 2 in flight 1.06x / 1.10x / 1.14x. Small chunks help random pairs on slow links but cost
# on fast ones: topology-aware DS-Sync training on S2 (its pairs mostly on 1 Gbit/s links) synced
# in 357 ms per step with 1 MB chunks, 249 ms with 16 MB and 257 ms with 4 MB. 4 MB is the
# compromise: within 1.15x of all_reduce pairs on all three.
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
# Chunks of a pair in their first phase at once. With 2, a pair's step on loopback cost 1.15x a
# raw whole-buffer exchange at 16M parameters (the pipeline drained between chunks); with 4,
# 1.01x, and the emulated clusters' iterations stayed as they were (`dssync bench`, 4M
# parameters, S1-S3, window 2 and 4 twice each, 2026-12-05: docs/bench.md).
DEFAULT_WINDOW = 4
# After a collective failed on a closed connection (not a timeout), the members still alive see
# it fail within milliseconds: the roll call waits this long for their keys, not its full window.
CLOSED_WINDOW_S = 1.0
# The longest the roll call waits for the store beyond its window (a stopped store host never
# answers): what a wait adds after its deadline is the roll call's window plus this.
STORE_GRACE_S = 1.0


def swap_ops(
    recv: torch.Tensor,
    send: torch.Tensor,
    peer: int,
    group: dist.ProcessGroup | None = None,
    tag: int = 0,
) -> list[dist.P2POp]:
    """Operations that receive ``recv`` from global rank ``peer`` while sending ``send`` to it.

    The receive comes first: on gloo it tells the peer its receive is ready before this rank's
    own send can queue bytes ahead of that notice. Both peers post in the same order, so
    messages match on gloo (by peer and tag) and on nccl (in posting order).
    """
    return [
        dist.P2POp(dist.irecv, recv, peer, group, tag),
        dist.P2POp(dist.isend, send, peer, group, tag),
    ]


def wait(
    work,
    deadline: float,
    tag: Tag,
    group: list[int],
    timeout_s: float,
    peers: list[int] | None = None,
    roll: RollCall | None = None,
    what: str | None = None,
    came: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> None:
    """Wait for ``work`` until ``deadline`` (monotonic seconds); raise PeerLost if it fails.

    The wait is :func:`dssync.comm.wait.wait_for` (bounded on every backend; on nccl an expiry
    aborts ``process_group``, the group ``work`` runs on, None for the default group).
    ``peers`` are the ranks this work waits on when known (an exchange); otherwise ``roll``, if
    given, finds which ranks of ``group`` never reached this point. The message says what the
    wait was (``what``, else the tag), who was missing, and what happened after how long (from
    the start of the operation, ``deadline - timeout_s``, to the raise, the roll call included):
    a wait that ran to its deadline met a peer silent past ``timeout_s`` (or, when every member
    came, a transfer that stalled); one that failed sooner met a closed connection (the peer
    exited or crashed). ``came``: every member had come (their tags were checked), so a rank
    the roll call misses stopped mid-transfer rather than never came.
    """
    if work is None:
        return
    try:
        wait_for(work, deadline, process_group)
    except WaitFailed as e:
        silent = e.expired
        failed_at = time.monotonic()
        if peers is None and roll is not None:  # after a closed connection the others are quick
            peers = roll.missing(group, timeout_s, tag, None if silent else CLOSED_WINDOW_S)
        # silent: every second until now, the roll call's included; closed: until it closed
        waited = (time.monotonic() if silent else failed_at) - min(e.started, deadline - timeout_s)
        cause = e.__cause__ if e.__cause__ is not None else e
        raise PeerLost(
            f"{what or tag.describe()} in group {group}: "
            f"{lost(peers, silent, waited, timeout_s, came)}; "
            f"cause: {type(cause).__name__}",
            step=tag.step,
            group=group,
            ranks=peers,
        ) from cause


def lost(
    peers: list[int] | None, silent: bool, waited: float, timeout_s: float, came: bool = False
) -> str:
    """Who was missing and what happened: silent past the timeout, or a connection closed; when
    every member came (``peers == []``): a stall past the timeout, or a broken connection.
    ``came``: the missing ranks had come, then stopped answering mid-transfer."""
    if peers == [] and silent:
        return (
            f"every member reached it, then it stalled for {waited:.1f} s, past timeout_s="
            f"{timeout_s:g} (a member stopped mid-transfer, or a link went down)"
        )
    if peers == []:
        return f"every member reached it, yet it failed after {waited:.1f} s (a connection broke)"
    who = (
        f"rank {peers[0]}"
        if peers and len(peers) == 1
        else (f"ranks {peers}" if peers else "some rank of the group")
    )
    if came and silent:
        return (
            f"{who} came, then stopped answering mid-transfer: silent for {waited:.1f} s, past "
            f"timeout_s={timeout_s:g} (stopped, hung, or cut off from the others)"
        )
    if came:
        return (
            f"{who} came, then went missing mid-transfer: the group's connections closed "
            f"after {waited:.1f} s of timeout_s={timeout_s:g} (it exited or crashed, or another "
            "member gave up on it)"
        )
    if silent:
        return (
            f"{who} never came: silent for {waited:.1f} s, past timeout_s={timeout_s:g} "
            "(stopped, hung, or at another step)"
        )
    return (
        f"{who} never came: the connection closed after {waited:.1f} s of timeout_s="
        f"{timeout_s:g} (it exited or crashed)"
    )


_arrivals: dict[str, int] = {}  # arrive() calls per averaging key: every member counts alike


class RollCall:
    """After a collective failed, find which ranks of its group never came (through the store).

    Each member that reached the failure writes a key for that averaging (its tag and the
    group's global ranks) into the process group's key-value store, then waits a short window
    (``min(timeout_s, 10)`` seconds) for the other members' keys. Members whose key is still
    absent are the ones that never came. There is no leader to blame and no message on a
    process group: a timed-out gloo wait closes the connections of its group, and ranks reach
    the failure at different times (each at its own timeout), so a later member still sees the
    keys of the earlier ones. Nothing is made at construction; the store is the one the ranks
    met through (``init_process_group``). A caller that calls :meth:`arrive` before the
    collective learns at once who never came (their arrival key is missing); when every member
    came, the window then tells who stopped mid-transfer (its key after the failure is missing).
    """

    def __init__(
        self, process_group: dist.ProcessGroup | None = None, window_s: float = 10.0
    ) -> None:
        self.parent = process_group if process_group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.parent)
        self.store = dist.distributed_c10d._get_default_store()
        self.window_s = window_s
        self._round: int | None = None  # set on the roll call arrive() returns

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.parent, r) if self.parent is not dist.group.WORLD else r

    def _key(self, group: list[int], tag: Tag) -> str:
        ranks = [self._global(r) for r in group]
        key = f"dssync/roll/{tag.kind}/{tag.step}/{tag.layout}/{','.join(map(str, ranks))}"
        return key if self._round is None else f"{key}/{self._round}"

    def arrive(self, group: list[int], tag: Tag) -> RollCall:
        """Say, before the collective, that this rank came to it. Returns a roll call over the
        same store that names at once a member that never came (every member that came has
        said so already) and whose keys are this arrival's own (the same tag may come again:
        ``Tag(ALL, -1, n)``)."""
        base = self._key(group, tag)
        said = copy.copy(self)
        said._round = _arrivals[base] = _arrivals.get(base, 0) + 1  # alike on every member
        self.store.set(f"{said._key(group, tag)}/{self._global(self.rank)}", "1")
        return said

    def missing(
        self, group: list[int], timeout_s: float, tag: Tag, window_s: float | None = None
    ) -> list[int] | None:
        """Ranks of ``group`` that never reached this failure; None if the store cannot say.

        Waits for their keys at most ``window_s`` (default: the roll call's own), and for the
        store at most :data:`STORE_GRACE_S` beyond: a store whose host is stopped (SIGSTOP) does
        not answer at all, and the roll call then gives up rather than hold the caller."""
        window = self.window_s if window_s is None else min(window_s, self.window_s)
        span = min(timeout_s, window)
        found: list[list[int] | None] = []
        asking = threading.Thread(
            target=lambda: found.append(self._absent(group, tag, span)),
            name="dssync-roll-call",
            daemon=True,
        )
        asking.start()
        asking.join(span + STORE_GRACE_S)
        return found[0] if found else None

    def _absent(self, group: list[int], tag: Tag, span: float) -> list[int] | None:
        ranks = [self._global(r) for r in group]
        base = self._key(group, tag)
        end = time.monotonic() + span
        try:
            if self._round is not None:  # every member that came said so before the collective
                never = [
                    r
                    for r, g in zip(group, ranks, strict=True)
                    if not self.store.check([f"{base}/{g}"])
                ]
                if never or span <= 0:
                    return never  # at once: no window for a word that was due before
                base = f"{base}/after"  # all came: who is still here after the failure?
            self.store.set(f"{base}/{self._global(self.rank)}", "1")
            while True:
                absent = [
                    r
                    for r, g in zip(group, ranks, strict=True)
                    if not self.store.check([f"{base}/{g}"])
                ]
                if not absent or time.monotonic() > end:
                    return absent
                time.sleep(0.05)
        except (dist.DistError, RuntimeError):  # the store's host is gone too
            return None


class Exchange:
    """Group averages by point-to-point messages on one parent group (no group creation).

    ``group`` ranks are ranks of ``process_group``. Receive buffers are kept between calls.
    ``arrived`` is when (``time.perf_counter``) the last call had every peer's tag: the
    moment the whole group had come, so what follows is transfer, not waiting for a late peer.
    ``verdict`` is the last call's :class:`~dssync.comm.tags.Verdict` (None: nothing to average).
    It is None after a pair whose tag rode inside its data (``inband``, below): there the wait
    and the transfer were one message. ``inband=False`` keeps the tag apart, for callers that
    time the transfer alone (re-planning).
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
        self._recv: dict[tuple[int, int], torch.Tensor] = {}
        self.arrived: float | None = None
        self.verdict: Verdict | None = None

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.parent, r) if self.parent is not dist.group.WORLD else r

    def _scratch(self, key: tuple[int, int], b: torch.Tensor) -> torch.Tensor:
        """A receive buffer shaped like flat ``b``: a view of one kept per key, grown only when
        ``b`` is larger (a slice of the model after the whole, or back, reuses it)."""
        have = self._recv.get(key)
        if (
            have is None
            or have.numel() < b.numel()
            or have.dtype != b.dtype
            or have.device != b.device
        ):
            have = self._recv[key] = torch.empty(b.numel(), dtype=b.dtype, device=b.device)
        return have[: b.numel()]

    def _chunks(self, b: torch.Tensor) -> list[slice]:
        step = max(self.chunk_bytes // b.element_size(), 1)
        return [slice(i, min(i + step, b.numel())) for i in range(0, b.numel(), step)]

    def average(
        self,
        buffers: Sequence[torch.Tensor],
        group: list[int],
        tag: Tag,
        timeout_s: float,
        finite: torch.Tensor | None = None,
    ) -> None:
        """Average ``buffers`` (flat, in place) with ``group``; ``finite``: this rank's finite
        flag for its tag (:func:`~dssync.comm.tags.finite_of`; default: finite)."""
        deadline = time.monotonic() + timeout_s
        peers = [r for r in group if r != self.rank]
        self.verdict = None
        if not peers:
            return
        if len(peers) == 1:
            self._pair(buffers, group, peers[0], tag, timeout_s, deadline, finite)
            return
        device = buffers[0].device if buffers else torch.device("cpu")
        mine = tag.tensor(device, finite)
        tags = {p: torch.empty_like(mine) for p in peers}
        ops = []
        for p in peers:
            ops += swap_ops(tags[p], mine, self._global(p), self.parent)
        slots = []  # (buffer index, slice, first op index) per chunk, in order
        recv = {}  # by position: memory stays k-1 buffers
        for i, b in enumerate(buffers):
            for j in range(len(peers)):
                recv[(j, i)] = self._scratch((j, i), b)
            for sl in self._chunks(b):
                slots.append((i, sl, len(ops)))
                for p in peers:
                    theirs = recv[(peers.index(p), i)]
                    ops += swap_ops(theirs[sl], b[sl], self._global(p), self.parent)
        works = dist.batch_isend_irecv(ops)
        if len(works) != len(ops):  # a backend that coalesces the batch into one work
            for w in works:
                wait(w, deadline, tag, group, timeout_s, peers, process_group=self.parent)
            works = [None] * len(ops)
        for j, p in enumerate(peers):
            wait(works[2 * j], deadline, tag, group, timeout_s, [p], process_group=self.parent)
            wait(works[2 * j + 1], deadline, tag, group, timeout_s, [p], process_group=self.parent)
        self.verdict = Verdict.of_peers(tag, mine, tags, group, self.rank)
        self.arrived = time.perf_counter()
        if self.verdict.known() is False:  # all members see the same tags: all keep their own
            for w in works[2 * len(peers) :]:
                wait(w, deadline, tag, group, timeout_s, peers, process_group=self.parent)
            return
        k = len(group)
        for i, sl, first in slots:
            for j, p in enumerate(peers):
                wait(
                    works[first + 2 * j],
                    deadline,
                    tag,
                    group,
                    timeout_s,
                    [p],
                    process_group=self.parent,
                )
                wait(
                    works[first + 2 * j + 1],
                    deadline,
                    tag,
                    group,
                    timeout_s,
                    [p],
                    process_group=self.parent,
                )
            own = buffers[i][sl]  # sent and received: free to overwrite
            parts = [own if r == self.rank else recv[(peers.index(r), i)][sl] for r in group]
            # the sum in group order, kept in the first member's buffer (own or a scratch) and
            # finished into own: no clone, no copy back, the same bits on every member
            total = parts[0]
            for part in parts[1:-1]:
                total.add_(part)
            torch.add(total, parts[-1], out=own).div_(k)

    def _pair(
        self,
        buffers: Sequence[torch.Tensor],
        group: list[int],
        peer: int,
        tag: Tag,
        timeout_s: float,
        deadline: float,
        finite: torch.Tensor | None = None,
    ) -> None:
        """Two ranks: each averages half of every chunk and sends it back (as a 2-rank all_reduce).

        Phase 1 of a chunk sends the half the peer owns and receives the peer's copy of the half
        this rank owns; this rank averages its half; phase 2 sends the averaged half and receives
        the peer's straight into place. Bytes per direction are those of a whole-buffer exchange,
        but each rank adds only half, and both end with the same bits (each half computed once).
        At most ``window`` chunks are in phase 1 at a time: chunk c's phase 2 and chunk c+window's
        phase 1 are posted when chunk c's phase 1 is done, in the same order on both ranks (so
        the peers' messages match), keeping the link busy without queueing a whole buffer.

        Buffers that make one chunk in all are swapped whole instead and both ranks take
        ``(own + theirs) / 2`` (IEEE addition commutes: the same bits, NaN payloads aside, which
        only a diverged run has): one round trip, not two, where no other chunk could hide the
        second (``tools/exchange_window.py``). One such buffer with room after it carries the tag
        in the same message (:meth:`_tagged`).
        """
        g = self._global(peer)
        first = self.rank < peer  # the lower rank owns the first half of each chunk

        def done(works: list) -> None:
            for w in works:
                wait(w, deadline, tag, group, timeout_s, [peer], process_group=self.parent)

        def post(ops: list) -> list:
            ops = _nonempty(ops)  # a one-element chunk has an empty half on each side
            return dist.batch_isend_irecv(ops) if ops else []

        room = room_of(buffers[0]) if self.inband and len(buffers) == 1 else None
        if room is not None and len(self._chunks(buffers[0])) == 1:
            self._tagged(buffers[0], room, group, peer, tag, done, post, finite)
            return
        device = buffers[0].device if buffers else torch.device("cpu")
        mine = tag.tensor(device, finite)
        theirs = torch.empty_like(mine)
        head = post(swap_ops(theirs, mine, g, self.parent))
        plan = []  # (buffer, own half, peer's half, recv buffer) per chunk, in order
        for i, b in enumerate(buffers):
            recv = self._scratch((0, i), b)
            for sl in self._chunks(b):
                mid = sl.start + (sl.stop - sl.start) // 2
                low, high = slice(sl.start, mid), slice(mid, sl.stop)
                own, other = (low, high) if first else (high, low)
                plan.append((b, own, other, recv))
        whole = len(plan) == 1
        if whole:  # one chunk: swapped whole, summed by both
            b, own, other, recv = plan[0]
            plan[0] = (b, slice(0, b.numel()), slice(0, b.numel()), recv)

        def phase1(c: int) -> list:
            b, own, other, recv = plan[c]
            # into a scratch buffer: nothing is used before the tags are checked
            return post(swap_ops(recv[own], b[other], g, self.parent))

        ahead = [phase1(c) for c in range(min(self.window, len(plan)))]
        done(head)
        self.verdict = Verdict.of_peers(tag, mine, {peer: theirs}, group, self.rank)
        self.arrived = time.perf_counter()
        if self.verdict.known() is False:  # both see the same tags: both keep their own
            for works in ahead:
                done(works)
            return
        back = []
        for c, (b, own, other, recv) in enumerate(plan):
            done(ahead[c])  # b[other] sent (it may now be overwritten); my half arrived
            b[own].add_(recv[own]).div_(2)
            if whole:
                break
            back += post(swap_ops(b[other], b[own], g, self.parent))
            if c + self.window < len(plan):
                ahead.append(phase1(c + self.window))
        done(back)

    def _tagged(
        self,
        b: torch.Tensor,
        room: torch.Tensor,
        group: list[int],
        peer: int,
        tag: Tag,
        done,
        post,
        finite: torch.Tensor | None = None,
    ) -> None:
        """A one-chunk pair whose buffer has room after it (:func:`~dssync.comm.buckets.room_of`):
        the tag is written into that room and swapped with the data in one message each way.
        The received tag is checked before any received byte is used, as in the other paths.
        One message fewer each way than the tag sent apart: at 1M parameters (one 4 MB chunk) a
        step cost 1.04-1.10x of a raw exchange against 1.14-1.25x, at 100k 2.9-3.1 ms against
        3.6-4.0 ms (``dssync bench-sync``, docs/results/bench-sync/loopback-4-tag-*.json).

        Both ranks must take this path alike: ``DSSync`` buckets agree across ranks (their
        layout is checked at start-up), and so does ``inband`` (from ``replan``). Buffers of
        different sizes are not caught by the tag on either path, as the data is posted before
        the tags are checked: gloo aborts the process that receives the longer message
        (``gloo::EnforceNotMet``, seen with the tag apart too), and on nccl they are undefined."""
        n = b.numel()
        mine = tag.tensor(b.device, finite)
        room[n:].view(torch.uint8)[:ROOM_BYTES].copy_(mine.view(torch.uint8))
        recv = self._scratch((0, 0), room)
        recv[n:].zero_()  # a shorter message from a peer of another layout reads as no tag
        done(post(swap_ops(recv, room, self._global(peer), self.parent)))
        theirs = recv[n:].view(torch.uint8)[:ROOM_BYTES].clone().view(torch.int64)
        self.verdict = Verdict.of_peers(tag, mine, {peer: theirs}, group, self.rank)
        self.arrived = None
        if self.verdict.known() is False:
            return
        b.add_(recv[:n]).div_(2)


def _nonempty(ops: list) -> list:
    return [op for op in ops if op.tensor.numel() > 0]


def collective_average(
    buffers: Sequence[torch.Tensor],
    process_group: dist.ProcessGroup | None,
    group: list[int],
    tag: Tag,
    timeout_s: float,
    roll: RollCall | None = None,
    finite: torch.Tensor | None = None,
) -> tuple[float, Verdict]:
    """Average ``buffers`` over all ranks of ``process_group`` (divide, then all-reduce), tagged.

    Returns when (``time.perf_counter``) the tags' all-reduce, posted first, had come: every
    member had come, so what follows is transfer (as :attr:`Exchange.arrived`), and the
    :class:`~dssync.comm.tags.Verdict` of the reduced tags (every member sees the same). The
    buffers are divided and reduced in place whatever it says: a caller that may be told "no"
    keeps their values to restore (:class:`~dssync.comm.averager.Router` does).
    """
    deadline = time.monotonic() + timeout_s
    if roll is not None and tag.kind == ALL:  # a rare average: say "I came" first (one store
        roll = roll.arrive(group, tag)  # key each), so a member waiting too is never named
    device = buffers[0].device if buffers else torch.device("cpu")
    me = dist.get_rank(process_group)
    # this rank's tag as [t, -t], then one slot per member: 1 where that member is not finite
    bad = torch.zeros(len(group), dtype=torch.int64, device=device)
    if finite is not None:
        bad[me].copy_(1 - finite)
    signed = torch.cat([tag.signed(device, finite), bad])
    sent = signed.clone()
    lend([signed, *buffers])
    works = [dist.all_reduce(signed, op=dist.ReduceOp.MAX, group=process_group, async_op=True)]
    for b in buffers:
        b.div_(len(group))
        works.append(dist.all_reduce(b, group=process_group, async_op=True))
    wait(works[0], deadline, tag, group, timeout_s, roll=roll, process_group=process_group)
    verdict = Verdict.of_signed(tag, sent, signed, group, group[me])
    arrived = time.perf_counter()
    for w in works[1:]:
        wait(w, deadline, tag, group, timeout_s, roll=roll, came=True, process_group=process_group)
    return arrived, verdict


def broadcast_tensors(
    tensors: Sequence[torch.Tensor],
    src: int,
    process_group: dist.ProcessGroup | None,
    timeout_s: float,
    roll: RollCall | None = None,
) -> None:
    """Overwrite ``tensors`` with group rank ``src``'s, packed per dtype (one broadcast each)."""
    tag = Tag(BROADCAST, 0, 0)
    deadline = time.monotonic() + timeout_s
    members = list(range(dist.get_world_size(process_group)))
    g_src = (
        src
        if process_group in (None, dist.group.WORLD)
        else dist.get_global_rank(process_group, src)
    )
    flats = pack(tensors)
    lend(f for f, _ in flats)
    works = [dist.broadcast(f, src=g_src, group=process_group, async_op=True) for f, _ in flats]
    for w in works:
        wait(w, deadline, tag, members, timeout_s, roll=roll, process_group=process_group)
    unpack(flats)


def average_tensors(
    tensors: Sequence[torch.Tensor],
    group: dist.ProcessGroup | None,
    group_size: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    timeout_s: float = 120.0,
) -> float:
    """Average ``tensors`` over every rank of ``group``: pack, reduce, unpack (tagged, bounded;
    a rank missing past ``timeout_s`` is named). Returns when every member had come
    (``time.perf_counter``, as :func:`collective_average`)."""
    flats = pack(tensors, bucket_bytes)
    buffers = [f for f, _ in flats]
    members = list(range(group_size))
    tag = Tag(ALL, -1, layout_of(buffers))
    saved = [b.clone() for b in buffers]
    arrived, verdict = collective_average(buffers, group, members, tag, timeout_s, RollCall(group))
    if not verdict.ok():  # off the averaging path: read at once
        for b, s in zip(buffers, saved, strict=True):
            b.copy_(s)
        raise verdict.out_of_step() or SyncError(
            f"non-finite values in {tag.describe()} in group {members}: the ranks kept their own",
            step=tag.step,
            group=members,
        )
    unpack(flats)
    return arrived
