"""Group averages that start now and finish later: the non-blocking form of the averaging core.

:func:`start` takes the same arguments as :meth:`dssync.comm.averager.Router.average` and picks
the same path (a collective on the parent group or on a group made at construction, else a
point-to-point exchange on the parent group), but only posts the transfers and returns a
:class:`Pending`. :meth:`Pending.wait` waits for them (bounded by ``timeout_s``, raising
``PeerLost``), checks the tags exactly as the blocking core does (``SyncError`` on a mismatch,
before any received byte is used) and returns the group means, one per buffer, leaving the
buffers given to :func:`start` untouched. Every member of the group gets the same bits, and they
are the bits the blocking core would have produced from the same buffers.

All transfers are posted from the caller's thread, so every rank issues its operations on a
process group in the same order; no thread is started here. Gloo and NCCL move the bytes in
their own threads while the caller computes.

Example::

    pending = start(router, [0, 1], OVERLAP, step=7, buffers=snapshot)
    ...                               # forward and backward of the next step run meanwhile
    means = pending.wait()            # one tensor per buffer of ``snapshot``
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from dssync.comm.averager import Router
from dssync.comm.exchange import wait
from dssync.comm.tags import Tag, check_peers, check_spread, layout_of

OVERLAP = 5  # the kind of an overlapped schedule step (a blocking step's tag is STEP)


class Pending:
    """One started group average; :meth:`wait` finishes it and returns the means."""

    def __init__(self, tag: Tag, group: list[int], timeout_s: float) -> None:
        self.tag = tag
        self.group = group
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s

    def wait(self) -> list[torch.Tensor]:
        raise NotImplementedError


class _Collective(Pending):
    def __init__(self, buffers, pg, group, tag, timeout_s, roll) -> None:
        super().__init__(tag, group, timeout_s)
        self.roll = roll
        device = buffers[0].device if buffers else torch.device("cpu")
        self.spread = tag.spread(device)
        self.means = [b.div(len(group)) for b in buffers]  # new tensors: the snapshot stays
        self.works = [dist.all_reduce(self.spread, op=dist.ReduceOp.MAX, group=pg, async_op=True)]
        self.works += [dist.all_reduce(m, group=pg, async_op=True) for m in self.means]

    def wait(self) -> list[torch.Tensor]:
        for w in self.works:
            wait(w, self.deadline, self.tag, self.group, self.timeout_s, roll=self.roll)
        check_spread(self.tag, self.spread, self.group)
        return self.means


class _Exchange(Pending):
    def __init__(self, buffers, router: Router, group, tag, timeout_s) -> None:
        super().__init__(tag, group, timeout_s)
        self.buffers = list(buffers)
        self.rank = router.rank
        self.peers = [r for r in group if r != router.rank]
        glob = router.exchange._global
        device = buffers[0].device if buffers else torch.device("cpu")
        mine = tag.tensor(device)
        self.tags = {p: torch.empty_like(mine) for p in self.peers}
        self.recv = {p: [torch.empty_like(b) for b in buffers] for p in self.peers}
        ops = []
        for p in self.peers:
            ops += [
                dist.P2POp(dist.isend, mine, glob(p), router.parent),
                dist.P2POp(dist.irecv, self.tags[p], glob(p), router.parent),
            ]
        for p in self.peers:
            for b, r in zip(self.buffers, self.recv[p], strict=True):
                ops += [
                    dist.P2POp(dist.isend, b, glob(p), router.parent),
                    dist.P2POp(dist.irecv, r, glob(p), router.parent),
                ]
        self._mine = mine  # kept alive until the sends are done
        self.works = dist.batch_isend_irecv(ops)
        self.coalesced = len(self.works) != len(ops)
        self.n_tag_ops = 2 * len(self.peers)

    def _wait(self, works, peers) -> None:
        for i, w in enumerate(works):
            who = [peers[(i // 2) % len(peers)]] if not self.coalesced else self.peers
            wait(w, self.deadline, self.tag, self.group, self.timeout_s, who)

    def wait(self) -> list[torch.Tensor]:
        if self.coalesced:
            self._wait(self.works, self.peers)
        else:
            self._wait(self.works[: self.n_tag_ops], self.peers)
        check_peers(self.tag, self.tags, self.group)  # before any received byte is used
        if not self.coalesced:
            rest = self.works[self.n_tag_ops :]
            per_peer = 2 * len(self.buffers)
            for j, p in enumerate(self.peers):
                for w in rest[j * per_peer : (j + 1) * per_peer]:
                    wait(w, self.deadline, self.tag, self.group, self.timeout_s, [p])
        k = len(self.group)
        means = []
        for i, own in enumerate(self.buffers):
            if k == 2:  # x_a + x_b is the same on both ranks: addition commutes exactly
                means.append(self.recv[self.peers[0]][i].add_(own).div_(2))
                continue
            parts = [own if r == self.rank else self.recv[r][i] for r in self.group]
            total = parts[0].clone()
            for part in parts[1:]:
                total.add_(part)
            means.append(total.div_(k))
        return means


class _Alone(Pending):
    def __init__(self, buffers, group, tag, timeout_s) -> None:
        super().__init__(tag, group, timeout_s)
        self.means = list(buffers)

    def wait(self) -> list[torch.Tensor]:
        return self.means


def start(
    router: Router,
    group: Sequence[int],
    kind: int,
    step: int,
    buffers: Sequence[torch.Tensor],
) -> Pending:
    """Post the average of ``buffers`` (flat, left untouched) with ``group``; wait() finishes it.

    The path is :meth:`Router.average`'s: the whole parent group or a group the router made
    collectively, anything else point to point. A group of one returns ``buffers`` as its means.
    """
    group = list(group)
    tag = Tag(kind, step, layout_of(buffers))
    if len(group) < 2:
        return _Alone(buffers, group, tag, router.timeout_s)
    if len(group) == router.size:
        return _Collective(buffers, router.parent, group, tag, router.timeout_s, router.roll)
    if tuple(group) in router.groups:
        pg = router.groups[tuple(group)]
        return _Collective(buffers, pg, group, tag, router.timeout_s, router.roll)
    return _Exchange(buffers, router, group, tag, router.timeout_s)
