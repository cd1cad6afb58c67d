"""Average tensors inside one group over torchft's process group, point to point.

Every member sends its values to every other member of the group and sums what it received in
the group's order (own values in their place), so all members compute bit-identical means. A
short header goes first (kind, averaging, quorum, element count): members that disagree raise
:class:`~dssync.errors.SyncError`, which is a bug, not a failure. A member lost before or during
the exchange (its connection closed, or no answer by the deadline) is named in the result and
the others keep their own values: the group skips this averaging, nothing else does.

A member that received every other member's values before one of them died applies the mean
while the others in its group may not; with pairs (the default) the other one is the dead one,
so nothing is lost. In a group of three or more that one averaging can mix unevenly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from dssync.errors import SyncError

HEADER = ("kind", "averaging", "quorum", "elements")
TAGS_PER_AVERAGING = 8  # message tags of one averaging: the header, then one per dtype


@dataclass
class Outcome:
    """What one group averaging did: ``means`` (None when it did not average) and the group
    ranks that were lost, each with what happened to it."""

    means: list[torch.Tensor] | None
    lost: dict[int, str] = field(default_factory=dict)


def flatten(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """One flat buffer per dtype, in the order the dtypes first appear."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t.detach().reshape(-1))
    return [torch.cat(ts) for ts in by_dtype.values()]


def unflatten(flats: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
    """Copy ``flats`` (made by :func:`flatten` of ``tensors``) back into ``tensors``."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for flat, ts in zip(flats, by_dtype.values(), strict=True):
        offset = 0
        for t in ts:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def average_in_group(
    pg,
    group: list[int],
    rank: int,
    flats: list[torch.Tensor],
    header: dict[str, int],
    timeout_s: float,
) -> Outcome:
    """The group's mean of ``flats`` (one per dtype, same layout on every member).

    ``group`` holds process group ranks in the order every member sums in; ``rank`` is this
    one's. Every wait ends by ``timeout_s`` after the call.
    """
    peers = [r for r in group if r != rank]
    deadline = time.monotonic() + timeout_s
    base = (header["averaging"] % 1_000_000) * TAGS_PER_AVERAGING  # stale messages never match
    mine = torch.tensor([header[k] for k in HEADER], dtype=torch.int64)
    theirs = {p: [torch.empty_like(mine)] for p in peers}
    lost = _exchange(pg, peers, {p: [mine] for p in peers}, theirs, base, deadline)
    for p, (got,) in theirs.items():
        if p not in lost and not torch.equal(got, mine):
            raise SyncError(
                "members of one group disagree: "
                f"rank {rank} has {dict(zip(HEADER, mine.tolist(), strict=True))}, "
                f"rank {p} has {dict(zip(HEADER, got.tolist(), strict=True))}",
                step=header["averaging"],
                group=group,
                ranks=[p],
            )
    if lost:
        return Outcome(None, lost)
    received = {p: [torch.empty_like(f) for f in flats] for p in peers}
    lost = _exchange(pg, peers, {p: flats for p in peers}, received, base + 1, deadline)
    if lost:
        return Outcome(None, lost)
    means = []
    for i, own in enumerate(flats):
        total = torch.zeros_like(own)
        for r in group:
            total += own if r == rank else received[r][i]
        means.append(total / len(group))
    return Outcome(means)


def _exchange(pg, peers, send, recv, tag, deadline) -> dict[int, str]:
    """Send ``send[p]`` to and receive ``recv[p]`` from every peer; return the peers whose
    transfer failed or did not end by ``deadline``, with what happened."""
    works = []
    lost: dict[int, str] = {}
    for p in peers:
        try:
            outgoing = [pg.send([t], p, tag + i) for i, t in enumerate(send[p])]
            incoming = [pg.recv([t], p, tag + i) for i, t in enumerate(recv[p])]
        except RuntimeError as e:  # a connection already closed
            lost[p] = f"{type(e).__name__}: {e}"
            continue
        works += [(p, w) for w in outgoing + incoming]
    for p, work in works:  # wait for all, so every loss is named
        if p in lost:
            continue
        left = deadline - time.monotonic()
        try:
            if left <= 0 or work.wait(timedelta(seconds=left)) is False:
                lost[p] = "no answer by the deadline"
        except RuntimeError as e:
            lost[p] = f"{type(e).__name__}: {e}"
    return lost
