"""The primitives beneath the transport: swap ops, the one bounded wait that names the peer,
the roll call, and the broadcast.

* :func:`swap_ops` posts a receive before its send. On gloo a send leaves only once the peer has
  said its receive is posted, and that notice travels on the same connection as data: posted
  after a send that could already go, it waited behind that send's bytes, and the two directions
  of a pair often ran one after the other (README, "Receives posted first").
* :func:`wait` is :func:`dssync.comm.wait.wait_for` (bounded on every backend) turned into
  :class:`~dssync.errors.PeerLost` naming the step, the group and the peer that never answered
  (or, through :class:`RollCall`, the members of a failed collective that never came). Failures
  are recognised by where they happen (the wait of our own operation), not by the words of the
  message.
* :func:`broadcast_tensors` overwrites tensors with one rank's, packed per dtype.

Group averages are :class:`dssync.comm.transport.Transport`'s, the one routine that moves bytes
for them; D-PSGD's neighbour swaps (:mod:`dssync.strategies.gossip`) and the bandwidth probe use
these primitives directly.

Example::

    works = dist.batch_isend_irecv(swap_ops(theirs, mine, peer))
    for w in works:
        wait(w, deadline, tag, group=[0, peer], timeout_s=60, peers=[peer])
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from dssync.comm.buckets import pack, unpack
from dssync.comm.inflight import lend
from dssync.comm.tags import BROADCAST, Tag
from dssync.comm.wait import WaitFailed, wait_for
from dssync.errors import PeerLost

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
    # on a polled backend (nccl), a member stuck on a live one learns that another member failed
    # (its roll call key is in the store) instead of waiting to its deadline
    ask = (lambda: roll.failed(group, tag)) if peers is None and roll is not None else None
    try:
        wait_for(work, deadline, process_group, ask)
    except WaitFailed as e:
        silent = e.expired
        failed_at = time.monotonic()
        if peers is None and roll is not None:
            # after a closed connection most members fail at once, but one that was waiting on
            # a live member (a ring's neighbour) only fails at its own deadline: while two or
            # more are absent, ask until then rather than name a member that is still waiting
            until = None if silent else deadline + CLOSED_WINDOW_S
            peers = roll.missing(group, timeout_s, tag, None if silent else CLOSED_WINDOW_S, until)
        start = min(e.started, deadline - timeout_s)
        # silent: every second until now, the roll call's included; closed: until it closed
        waited = (time.monotonic() if silent else failed_at) - start
        asked = time.monotonic() - start
        cause = e.__cause__ if e.__cause__ is not None else e
        said = lost(peers, silent, waited, timeout_s, came)
        if not silent and asked - waited > CLOSED_WINDOW_S + STORE_GRACE_S:
            said += f"; named after {asked:.1f} s, once the members still waiting had failed"
        raise PeerLost(
            f"{what or tag.describe()} in group {group}: {said}; cause: {type(cause).__name__}",
            step=tag.index,
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
        key = f"dssync/roll/{tag.kind}/{tag.index}/{tag.layout}/{','.join(map(str, ranks))}"
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
        self,
        group: list[int],
        timeout_s: float,
        tag: Tag,
        window_s: float | None = None,
        until: float | None = None,
    ) -> list[int] | None:
        """Ranks of ``group`` that never reached this failure; None if the store cannot say.

        Waits for their keys at most ``window_s`` (default: the roll call's own), then, while
        two or more are still absent, until ``until`` (monotonic seconds; one lost member is
        the usual case, and a second absent one is likely a member still waiting on a live
        one until its own deadline); and for the store at most :data:`STORE_GRACE_S` beyond:
        a store whose host is stopped (SIGSTOP) does not answer at all, and the roll call then
        gives up rather than hold the caller."""
        window = self.window_s if window_s is None else min(window_s, self.window_s)
        span = min(timeout_s, window)
        longest = span if until is None else max(span, until - time.monotonic())
        found: list[list[int] | None] = []
        asking = threading.Thread(
            target=lambda: found.append(self._absent(group, tag, span, longest)),
            name="dssync-roll-call",
            daemon=True,
        )
        asking.start()
        asking.join(longest + STORE_GRACE_S)
        return found[0] if found else None

    def failed(self, group: list[int], tag: Tag) -> bool:
        """Whether another member of ``group`` already met a failure of this averaging (it
        wrote its key after the failure): asked by a wait that is still blocked."""
        base = self._key(group, tag)
        if self._round is not None:
            base = f"{base}/after"
        me = self._global(self.rank)
        return any(
            self.store.check([f"{base}/{g}"]) for g in (self._global(r) for r in group) if g != me
        )

    def _absent(
        self, group: list[int], tag: Tag, span: float, longest: float | None = None
    ) -> list[int] | None:
        ranks = [self._global(r) for r in group]
        base = self._key(group, tag)
        start = time.monotonic()
        end, last = start + span, start + (span if longest is None else longest)
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
                now = time.monotonic()
                if not absent or now > last or (now > end and len(absent) < 2):
                    return absent
                time.sleep(0.05)
        except (dist.DistError, RuntimeError):  # the store's host is gone too
            return None


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
