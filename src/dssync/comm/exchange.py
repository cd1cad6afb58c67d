"""How bytes move for one group average: point-to-point exchange, or a collective on a made group.

Both paths take flat buffers on the parameters' device, a :class:`~dssync.comm.tags.Tag`, and a
deadline; both leave every member with bit-identical buffers (the group mean) or raise.

* :class:`Exchange` averages a group of ranks of one parent group by ``dist.batch_isend_irecv``
  on that parent group, so no process group is ever created for it. Each member sends its tag,
  then its buffers cut into chunks of ``chunk_bytes``, to every other member and receives theirs.
  The chunks are posted at once and combined in order as they arrive, so a pair sending both ways
  keeps the link busy while the previous chunk is summed instead of moving one whole buffer each
  way and waiting. Members sum in group order (not "mine first"), so all of them compute the same
  floating-point sum. Tags are compared exactly before any received byte is used. A group of k
  moves k-1 buffers per member: meant for pairs and small groups of a schedule that never repeats.
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

import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from dssync.comm.tags import BROADCAST, Tag, check_peers, check_spread
from dssync.errors import PeerLost

DEFAULT_CHUNK_BYTES = 2 * 1024 * 1024


def wait(
    work,
    deadline: float,
    tag: Tag,
    group: list[int],
    timeout_s: float,
    peers: list[int] | None = None,
    roll: RollCall | None = None,
) -> None:
    """Wait for ``work`` until ``deadline`` (monotonic seconds); raise PeerLost if it fails.

    ``peers`` are the ranks this work waits on when known (an exchange); otherwise ``roll``, if
    given, finds which ranks of ``group`` never reached this point.
    """
    if work is None:
        return
    left = max(deadline - time.monotonic(), 0.001)
    try:
        work.wait(timeout=timedelta(seconds=left))
    except (dist.DistError, RuntimeError) as e:
        if peers is None and roll is not None:
            peers = roll.missing(group, timeout_s)
        who = (
            f"rank {peers[0]} never came"
            if peers and len(peers) == 1
            else (f"ranks {peers} never came" if peers else "some rank of the group never came")
        )
        raise PeerLost(
            f"{tag.describe()} in group {group}: {who} within timeout_s={timeout_s:g} "
            f"(stopped, crashed, or at another step); cause: {type(e).__name__}",
            step=tag.step,
            group=group,
            ranks=peers,
        ) from e


class RollCall:
    """After a collective failed, find which ranks of its group never came (point to point).

    Uses a gloo group of its own over the parent group's ranks, made at construction: the
    failed collective may have closed connections of the training group. Each member that
    reached the failure reports to the group's first rank that answers; the ranks that do not
    report within a short wait are the ones that never came, and every member learns the list.
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        parent = process_group if process_group is not None else dist.group.WORLD
        self.parent = parent
        self.rank = dist.get_rank(parent)
        ranks = dist.get_process_group_ranks(parent)
        local = len(ranks) != dist.get_world_size()
        self.pg = dist.new_group(ranks, backend="gloo", use_local_synchronization=local)

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.parent, r) if self.parent is not dist.group.WORLD else r

    def missing(self, group: list[int], timeout_s: float) -> list[int]:
        wait_s = timedelta(seconds=min(timeout_s, 10.0))
        leader, n = group[0], len(group)
        try:
            if self.rank == leader:
                flags = {r: torch.zeros(1, dtype=torch.int64) for r in group if r != leader}
                works = {r: dist.irecv(f, self._global(r), group=self.pg) for r, f in flags.items()}
                absent = []
                for r, w in works.items():
                    try:
                        w.wait(timeout=wait_s)
                    except (dist.DistError, RuntimeError):
                        absent.append(r)
                answer = torch.full((n,), -1, dtype=torch.int64)
                answer[: len(absent)] = torch.tensor(absent, dtype=torch.int64)
                for r in works:
                    if r not in absent:
                        dist.isend(answer, self._global(r), group=self.pg).wait(timeout=wait_s)
                return absent
            dist.isend(torch.ones(1, dtype=torch.int64), self._global(leader), group=self.pg).wait(
                timeout=wait_s
            )
            answer = torch.empty(n, dtype=torch.int64)
            dist.irecv(answer, self._global(leader), group=self.pg).wait(timeout=wait_s)
            return [int(r) for r in answer.tolist() if r >= 0]
        except (dist.DistError, RuntimeError):
            return [leader]


class Exchange:
    """Group averages by point-to-point messages on one parent group (no group creation).

    ``group`` ranks are ranks of ``process_group``. Receive buffers are kept between calls.
    """

    def __init__(
        self, process_group: dist.ProcessGroup | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> None:
        self.parent = process_group if process_group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.parent)
        self.chunk_bytes = chunk_bytes
        self._recv: dict[tuple[int, int], torch.Tensor] = {}

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.parent, r) if self.parent is not dist.group.WORLD else r

    def _chunks(self, b: torch.Tensor) -> list[slice]:
        step = max(self.chunk_bytes // b.element_size(), 1)
        return [slice(i, min(i + step, b.numel())) for i in range(0, b.numel(), step)]

    def average(
        self, buffers: Sequence[torch.Tensor], group: list[int], tag: Tag, timeout_s: float
    ) -> None:
        deadline = time.monotonic() + timeout_s
        peers = [r for r in group if r != self.rank]
        if not peers:
            return
        device = buffers[0].device if buffers else torch.device("cpu")
        mine = tag.tensor(device)
        tags = {p: torch.empty_like(mine) for p in peers}
        ops = []
        for p in peers:
            ops += [
                dist.P2POp(dist.isend, mine, self._global(p), self.parent),
                dist.P2POp(dist.irecv, tags[p], self._global(p), self.parent),
            ]
        slots = []  # (buffer index, slice, first op index) per chunk, in order
        for i, b in enumerate(buffers):
            for p in peers:
                key = (p if len(peers) > 1 else -1, i)
                if (
                    key not in self._recv
                    or self._recv[key].shape != b.shape
                    or self._recv[key].dtype != b.dtype
                    or self._recv[key].device != b.device
                ):
                    self._recv[key] = torch.empty_like(b)
            for sl in self._chunks(b):
                slots.append((i, sl, len(ops)))
                for p in peers:
                    theirs = self._recv[(p if len(peers) > 1 else -1, i)]
                    ops += [
                        dist.P2POp(dist.isend, b[sl], self._global(p), self.parent),
                        dist.P2POp(dist.irecv, theirs[sl], self._global(p), self.parent),
                    ]
        works = dist.batch_isend_irecv(ops)
        if len(works) != len(ops):  # a backend that coalesces the batch into one work
            for w in works:
                wait(w, deadline, tag, group, timeout_s, peers)
            works = [None] * len(ops)
        for j, p in enumerate(peers):
            wait(works[2 * j], deadline, tag, group, timeout_s, [p])
            wait(works[2 * j + 1], deadline, tag, group, timeout_s, [p])
        check_peers(tag, tags, group)
        k = len(group)
        for i, sl, first in slots:
            for j, p in enumerate(peers):
                wait(works[first + 2 * j], deadline, tag, group, timeout_s, [p])
                wait(works[first + 2 * j + 1], deadline, tag, group, timeout_s, [p])
            own = buffers[i][sl]
            if k == 2:  # x_a + x_b is the same on both ranks: addition commutes exactly
                own.add_(self._recv[(-1, i)][sl]).div_(2)
                continue
            parts = [own if r == self.rank else self._recv[(r, i)][sl] for r in group]
            total = parts[0].clone()
            for part in parts[1:]:
                total.add_(part)
            own.copy_(total.div_(k))


def collective_average(
    buffers: Sequence[torch.Tensor],
    process_group: dist.ProcessGroup | None,
    group: list[int],
    tag: Tag,
    timeout_s: float,
    roll: RollCall | None = None,
) -> None:
    """Average ``buffers`` over all ranks of ``process_group`` (divide, then all-reduce), tagged."""
    deadline = time.monotonic() + timeout_s
    device = buffers[0].device if buffers else torch.device("cpu")
    spread = tag.spread(device)
    works = [dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=process_group, async_op=True)]
    for b in buffers:
        b.div_(len(group))
        works.append(dist.all_reduce(b, group=process_group, async_op=True))
    for w in works:
        wait(w, deadline, tag, group, timeout_s, roll=roll)
    check_spread(tag, spread, group)


def broadcast_tensors(
    tensors: Sequence[torch.Tensor],
    src: int,
    process_group: dist.ProcessGroup | None,
    timeout_s: float,
    roll: RollCall | None = None,
) -> None:
    """Overwrite ``tensors`` with group rank ``src``'s, packed per dtype (one broadcast each)."""
    from dssync.comm.buckets import pack, unpack

    tag = Tag(BROADCAST, 0, 0)
    deadline = time.monotonic() + timeout_s
    members = list(range(dist.get_world_size(process_group)))
    g_src = (
        src
        if process_group in (None, dist.group.WORLD)
        else dist.get_global_rank(process_group, src)
    )
    flats = pack(tensors)
    works = [dist.broadcast(f, src=g_src, group=process_group, async_op=True) for f, _ in flats]
    for w in works:
        wait(w, deadline, tag, members, timeout_s, roll=roll)
    unpack(flats)
