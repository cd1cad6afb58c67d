"""Step tags: every averaging carries what it believes it is doing, and checks the others agree.

A tag is three integers: the kind of averaging (a schedule step, ``average_all``, a
``GroupAverager`` call), the step, and a 63-bit fingerprint of the bucket layout (sizes and
dtypes of the flat buffers). It travels in the same operation as the data, as a small int64
tensor on the data's device:

* In a point-to-point exchange each peer's tag is sent first, posted with the data, and
  compared exactly (integers, no floating sum) before any received byte is used, so a mismatch
  mixes nothing. A pair whose model is one message sends it in the spare bytes after the data
  (:func:`dssync.comm.buckets.room_of`), still checked before the data is used.
* In a collective the tag tensor holds ``[t, -t]`` and is all-reduced with ``MAX`` beside the data:
  the maximum of ``t`` and of ``-t`` equal ``t`` and ``-t`` on every rank exactly when every rank
  sent the same ``t``. Integer max is exact for any value (no overflow, no rounding), whatever the
  dtype of the buckets (bfloat16 included).

On a mismatch every rank of the group raises :class:`dssync.errors.SyncError` naming the step,
the group and the ranks whose tag differs (or, in a collective, that some rank differs).

Example::

    tag = Tag(STEP, step=12, layout=layout_of(buffers))
    tag.tensor(device)            # tensor([kind, 12, layout])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dssync.errors import SyncError
from dssync.hashing import fingerprint

STEP, ALL, AVERAGER, BROADCAST, PROBE, META = 1, 2, 3, 4, 5, 7
KIND_NAMES = {
    STEP: "a schedule step",
    ALL: "average_all()",
    AVERAGER: "GroupAverager",
    BROADCAST: "the start-up broadcast",
    PROBE: "the bandwidth probe",
    META: "an exchange of metadata",
}


@dataclass(frozen=True)
class Tag:
    """What an averaging is: its kind, its step and the layout of its buffers."""

    kind: int
    step: int
    layout: int

    def tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor([self.kind, self.step, self.layout], dtype=torch.int64, device=device)

    def signed(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[t, -t]``, for a MAX all-reduce that agrees exactly when every rank sent the same."""
        t = self.tensor(device)
        return torch.cat([t, -t])

    def describe(self) -> str:
        return f"{KIND_NAMES.get(self.kind, self.kind)} at step {self.step}"


def layout_of(buffers: Sequence[torch.Tensor], part: tuple[int, int] = (0, 1)) -> int:
    """A 63-bit fingerprint of the sizes and dtypes of ``buffers``, in order, and of ``part``
    (the slice of the model they are; two slices of equal size still differ)."""
    text = ";".join(f"{b.numel()}:{b.dtype}" for b in buffers)
    return fingerprint(text if part == (0, 1) else f"{text}|part {part[0]}/{part[1]}")


def decode(t: torch.Tensor) -> Tag:
    kind, step, layout = (int(v) for v in t.tolist())
    return Tag(kind, step, layout)


def check_peers(mine: Tag, theirs: dict[int, torch.Tensor], group: list[int]) -> None:
    """Raise SyncError unless every peer's received tag equals ``mine`` (exact integers)."""
    odd = {r: decode(t) for r, t in theirs.items() if decode(t) != mine}
    if odd:
        seen = "; ".join(
            f"rank {r} sent {t.describe()}"
            + ("" if t.layout == mine.layout else " with another bucket layout")
            for r, t in sorted(odd.items())
        )
        raise SyncError(
            f"ranks out of step in group {group}: this rank is at {mine.describe()}, {seen}; "
            "every rank must call step() equally often (use `with Join([sync]):` for uneven data)",
            step=mine.step,
            group=group,
            ranks=sorted(odd),
        )


def check_signed(mine: Tag, reduced: torch.Tensor, group: list[int]) -> None:
    """Raise SyncError unless a MAX-reduced ``signed`` tensor shows every rank sent ``mine``."""
    high, low = reduced[:3].tolist(), [-v for v in reduced[3:].tolist()]
    want = [mine.kind, mine.step, mine.layout]
    if high != want or low != want:
        lo, hi = Tag(*low), Tag(*high)
        raise SyncError(
            f"ranks out of step in group {group}: this rank is at {mine.describe()}, the group "
            f"spans {lo.describe()} to {hi.describe()}"
            + ("" if lo.layout == hi.layout else " with different bucket layouts")
            + "; every rank must call step() equally often (use `with Join([sync]):` for uneven data)",
            step=mine.step,
            group=group,
        )
