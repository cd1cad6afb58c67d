"""Step tags: every averaging carries what it believes it is doing, and checks the others agree.

A tag is three integers: the kind of averaging (:class:`Kind`: a schedule's group average,
``average_all``, a ``GroupAverager`` call, an overlapped average, ...), its index (which one of
its kind: for an averaging, the number of averagings before it, never a count of optimizer
steps), and a 63-bit fingerprint of the bucket layout (sizes and dtypes of the flat buffers). It travels in the same operation as the
data, as a small int64 tensor on the data's device, with one more field: whether every value
this rank sends is finite (a reduction on the device, :func:`finite_of`).

* In a point-to-point exchange each peer's tag is sent first, posted with the data, and
  compared exactly (integers, no floating sum) on the device. A pair whose model is one message
  sends it in the spare bytes after the data (:func:`dssync.comm.buckets.room_of`).
* In a collective the tag tensor holds ``[t, -t]`` and is all-reduced with ``MAX`` beside the data:
  the maximum of ``t`` and of ``-t`` equal ``t`` and ``-t`` on every rank exactly when every rank
  sent the same ``t``. Integer max is exact for any value (no overflow, no rounding), whatever the
  dtype of the buckets (bfloat16 included); the finite field's ``-f`` half gives the minimum.

No check reads the device on the host. The comparison makes a :class:`Verdict`: a boolean on the
device that says whether the averaging may be applied (every tag equal, every sender finite),
and a host mirror of it filled by a non-blocking copy. Every member of a group computes the same
verdict from the same tags, so all apply, or all keep their own values, and stay alike. The
mirror is read where it is already there without waiting: on the CPU (gloo) right after the
tags' wait; on a GPU once the copy's event has completed, at the latest at the next averaging.
A verdict that says no then raises :class:`dssync.errors.SyncError` on every member of the
group, naming the averaging, the group and the ranks whose tag differs, or the rank whose values
were not finite; only then are the received tags read on the host (the error path).

Example::

    tag = Tag(Kind.STEP, index=12, layout=layout_of(buffers))
    tag.tensor(device)            # tensor([1, 12, layout, 1])
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import torch

from dssync.errors import SyncError
from dssync.hashing import fingerprint


class Kind(IntEnum):
    """What an averaging (or another tagged exchange) is; one number each, never reused."""

    STEP = 1
    ALL = 2
    AVERAGER = 3
    BROADCAST = 4
    PROBE = 5
    OVERLAP = 6
    META = 7

    def describe(self) -> str:
        return _KIND_NAMES[self]


_KIND_NAMES = {
    Kind.STEP: "the schedule's group average",
    Kind.ALL: "average_all()",
    Kind.AVERAGER: "GroupAverager",
    Kind.BROADCAST: "the start-up broadcast",
    Kind.PROBE: "the bandwidth probe",
    Kind.OVERLAP: "an overlapped average",
    Kind.META: "an exchange of metadata",
}
# the kinds by their names, for `from dssync.comm.tags import STEP`
STEP, ALL, AVERAGER, BROADCAST, PROBE, OVERLAP, META = (
    Kind.STEP,
    Kind.ALL,
    Kind.AVERAGER,
    Kind.BROADCAST,
    Kind.PROBE,
    Kind.OVERLAP,
    Kind.META,
)
# the kinds whose index counts averagings
AVERAGINGS = (Kind.STEP, Kind.ALL, Kind.AVERAGER, Kind.OVERLAP)


FIELDS = 4  # kind, index, layout, finite
FINITE = 3  # the field that says whether every value the sender sends is finite (1) or not (0)


@dataclass(frozen=True)
class Tag:
    """What an averaging is: its kind, its index and the layout of its buffers.

    ``index`` says which one of its kind: for the averaging kinds (:data:`AVERAGINGS`) the
    averagings counted before it (DSSync's ``averagings``, a GroupAverager's ``step``), for a
    metadata exchange its call number, 0 for the one-off kinds.

    >>> Tag(Kind.STEP, 3, 0).describe()
    "the schedule's group average at averaging 3"
    """

    kind: int
    index: int
    layout: int

    def tensor(
        self, device: torch.device | str = "cpu", finite: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[kind, index, layout, finite]`` on ``device``, with no blocking copy: on a GPU it
        comes from pinned host memory by a non-blocking copy; ``finite`` (a device scalar,
        :func:`finite_of`) is written on the device (default 1)."""
        values = torch.tensor([int(self.kind), self.index, self.layout, 1], dtype=torch.int64)
        device = torch.device(device)
        if device.type == "cuda":
            t = values.pin_memory().to(device, non_blocking=True)
        else:
            t = values.to(device)
        if finite is not None:
            t[FINITE].copy_(finite)
        return t

    def signed(
        self, device: torch.device | str = "cpu", finite: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[t, -t]``, for a MAX all-reduce that agrees exactly when every rank sent the same."""
        t = self.tensor(device, finite)
        return torch.cat([t, -t])

    def describe(self) -> str:
        kind = Kind(self.kind).describe() if self.kind in Kind._value2member_map_ else self.kind
        if self.kind in AVERAGINGS:
            return f"{kind} at averaging {self.index}"
        return f"{kind} #{self.index}"


def layout_of(buffers: Sequence[torch.Tensor], part: tuple[int, int] = (0, 1)) -> int:
    """A 63-bit fingerprint of the sizes and dtypes of ``buffers``, in order, and of ``part``
    (the slice of the model they are; two slices of equal size still differ)."""
    text = ";".join(f"{b.numel()}:{b.dtype}" for b in buffers)
    return fingerprint(text if part == (0, 1) else f"{text}|part {part[0]}/{part[1]}")


def finite_of(buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """1 (int64, on the buffers' device) when every element of ``buffers`` is finite, else 0.

    One sum per buffer on the device (a NaN or an infinity makes its sum non-finite), read by
    nobody on the host: the result travels in the tag's :data:`FINITE` field. A sum can also
    overflow on finite values past about 1e38 (float32); :func:`first_nonfinite` tells the two
    apart on the error path."""
    if not buffers:
        return torch.ones((), dtype=torch.int64)
    if len(buffers) == 1:  # the usual case (one bucket): no stack
        return buffers[0].sum(dtype=torch.float32).isfinite().to(torch.int64)
    sums = torch.stack([b.sum(dtype=torch.float32) for b in buffers])
    return sums.isfinite().all().to(torch.int64)


def first_nonfinite(buffers: Sequence[torch.Tensor]) -> tuple[int, int] | None:
    """``(buffer, element)`` of the first non-finite value in ``buffers`` (host reads: for error
    messages only), or None."""
    for i, b in enumerate(buffers):
        bad = (~torch.isfinite(b)).nonzero()
        if bad.numel():
            return i, int(bad[0, 0])
    return None


def decode(t: torch.Tensor) -> Tag:
    kind, index, layout = (int(v) for v in t[:3].tolist())
    return Tag(kind, index, layout)


def reads_free(device: torch.device) -> bool:
    """Whether reading a result of ``device`` on the host costs no wait (the CPU: after gloo's
    wait the bytes are in host memory). Elsewhere verdicts are applied on the device."""
    return device.type == "cpu"


class _Mirror:
    """Host copies of verdicts for one thread and device: pinned booleans reused in turn, read
    through a numpy view made once (host memory, not the device) after their copy's event."""

    SLOTS = 8

    def __init__(self, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.host = torch.zeros(self.SLOTS, dtype=torch.bool, pin_memory=cuda)
        self.view = self.host.numpy()
        self.events: list = [None] * self.SLOTS
        self.cuda = cuda
        self.next = 0

    def put(self, go: torch.Tensor) -> int:
        slot = self.next
        self.next = (slot + 1) % self.SLOTS
        event = self.events[slot]
        if event is not None:  # that slot's verdict was read long ago (a Router keeps one)
            event.synchronize()
        self.host[slot].copy_(go, non_blocking=self.cuda)
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(go.device))
            self.events[slot] = event
        return slot

    def ready(self, slot: int) -> bool:
        event = self.events[slot]
        return event is None or event.query()

    def read(self, slot: int) -> bool:
        event = self.events[slot]
        if event is not None:
            event.synchronize()
        return bool(self.view[slot])


_local = threading.local()


def _mirror(device: torch.device) -> _Mirror:
    mirrors = _local.__dict__.setdefault("mirrors", {})
    if device not in mirrors:
        mirrors[device] = _Mirror(device)
    return mirrors[device]


class Verdict:
    """Whether an averaging may be applied: every tag equal to this rank's, every sender finite.

    ``go`` is a boolean on the device (on the CPU, a host ``bool`` read from the tags' few
    integers); every member computes it from the same tags, so all agree. :meth:`known` reads
    its host mirror only where that costs no wait (None otherwise); :meth:`check` raises the
    :class:`SyncError` a ``False`` verdict means (waiting for the mirror if it must: call it
    where the code already waits, or one averaging later).
    """

    def __init__(
        self,
        go: torch.Tensor | bool,
        tag: Tag,
        group: list[int],
        rank: int,
        sent: torch.Tensor,
        theirs: dict[int, torch.Tensor] | None = None,
        reduced: torch.Tensor | None = None,
    ) -> None:
        self.go, self.tag, self.group, self.rank = go, tag, list(group), rank
        self._sent, self._theirs, self._reduced = sent, theirs, reduced
        if isinstance(go, bool):  # read on the host already (the CPU): no mirror
            self._host: bool | None = go
            return
        self._host = None
        self._mirror = _mirror(go.device)
        self._slot = self._mirror.put(go)

    @classmethod
    def of_peers(
        cls,
        tag: Tag,
        sent: torch.Tensor,
        theirs: dict[int, torch.Tensor],
        group: list[int],
        rank: int,
    ) -> Verdict:
        """From each peer's received tag (``theirs``) and this rank's (``sent``)."""
        if reads_free(sent.device):  # a few host integers: no tensor ops to build a boolean
            mine = sent.tolist()
            rows = [mine, *(t.tolist() for t in theirs.values())]
            go = all(r[:FINITE] == mine[:FINITE] and r[FINITE] == 1 for r in rows)
            return cls(go, tag, group, rank, sent, theirs=theirs)
        tags = torch.stack([sent, *theirs.values()])
        same = (tags[:, :FINITE] == sent[:FINITE]).all()
        go = same & (tags[:, FINITE] == 1).all()
        return cls(go, tag, group, rank, sent, theirs=theirs)

    @classmethod
    def of_signed(
        cls, tag: Tag, sent: torch.Tensor, reduced: torch.Tensor, group: list[int], rank: int
    ) -> Verdict:
        """From a MAX-reduced :meth:`Tag.signed` tensor followed by one slot per member of
        ``group`` (1 where that member's values are not finite); ``sent`` is this rank's."""
        if reads_free(sent.device):
            got, mine = reduced.tolist(), sent.tolist()[:FINITE]
            high, low = got[:FINITE], [-v for v in got[FIELDS : FIELDS + FINITE]]
            go = high == mine and low == mine and not any(got[2 * FIELDS :])
            return cls(go, tag, group, rank, sent, reduced=reduced)
        high, low = reduced[:FINITE], reduced[FIELDS : FIELDS + FINITE].neg()
        same = (high == sent[:FINITE]).all() & (low == sent[:FINITE]).all()
        go = same & (reduced[2 * FIELDS :] == 0).all()
        return cls(go, tag, group, rank, sent, reduced=reduced)

    def known(self) -> bool | None:
        """The verdict if the host can have it without waiting for a device, else None."""
        if self._host is not None:
            return self._host
        if not reads_free(self.go.device) or not self._mirror.ready(self._slot):
            return None
        return self._mirror.read(self._slot)

    def ok(self) -> bool:
        """The verdict, waiting for its copy to the host if it must."""
        if self._host is not None:
            return self._host
        return self._mirror.read(self._slot)

    def nonfinite(self) -> list[int]:
        """Ranks whose tag said their values were not finite (host reads: error path only)."""
        if self._reduced is not None:
            slots = self._reduced[2 * FIELDS :].tolist()
            return [r for r, bad in zip(self.group, slots, strict=True) if bad]
        flags = {self.rank: int(self._sent[FINITE])}
        flags.update({r: int(t[FINITE]) for r, t in (self._theirs or {}).items()})
        return sorted(r for r, f in flags.items() if f != 1)

    def out_of_step(self) -> SyncError | None:
        """The error for tags that differ (host reads: error path only), or None."""
        if self._theirs is not None:
            return _check_peers(self.tag, self._theirs, self.group)
        return _check_signed(self.tag, self._reduced, self.group)


def _check_peers(mine: Tag, theirs: dict[int, torch.Tensor], group: list[int]) -> SyncError | None:
    odd = {r: decode(t) for r, t in theirs.items() if decode(t) != mine}
    if not odd:
        return None
    seen = "; ".join(
        f"rank {r} sent {t.describe()}"
        + ("" if t.layout == mine.layout else " with another bucket layout")
        for r, t in sorted(odd.items())
    )
    return SyncError(
        f"ranks out of step in group {group}: this rank is at {mine.describe()}, {seen}; "
        "every rank must call step() equally often (use `with Join([sync]):` for uneven data)",
        step=mine.index,
        group=group,
        ranks=sorted(odd),
    )


def _check_signed(mine: Tag, reduced: torch.Tensor, group: list[int]) -> SyncError | None:
    high = reduced[:FINITE].tolist()
    low = [-v for v in reduced[FIELDS : FIELDS + FINITE].tolist()]
    want = [int(mine.kind), mine.index, mine.layout]
    if high == want and low == want:
        return None
    lo, hi = Tag(*low), Tag(*high)
    return SyncError(
        f"ranks out of step in group {group}: this rank is at {mine.describe()}, the group "
        f"spans {lo.describe()} to {hi.describe()}"
        + ("" if lo.layout == hi.layout else " with different bucket layouts")
        + "; every rank must call step() equally often (use `with Join([sync]):` for uneven data)",
        step=mine.index,
        group=group,
    )


def check_peers(mine: Tag, theirs: dict[int, torch.Tensor], group: list[int]) -> None:
    """Raise SyncError unless every peer's received tag equals ``mine`` (exact integers; host
    reads: for exchanges off the averaging path)."""
    error = _check_peers(mine, theirs, group)
    if error is not None:
        raise error
