"""Overlapped averaging (``DSSync(overlap=True)``): each average runs while the next steps compute.

At an averaging, :meth:`DSSync.step <dssync.strategies.dssync.DSSync.step>` copies the flat buckets (parameters
and floating buffers) and, when given, the optimizer's floating state into a snapshot and starts
this step's group average of the snapshot without blocking. The next forward and backward run
meanwhile. The average runs on a :class:`~dssync.comm.lane.Lane`: a process group and a thread
of its own, made at construction, so the pair exchange's chunk window keeps moving while the
caller computes and the caller's own traffic on the training group never interleaves with it. At the next averaging the average is waited for and merged::

    x <- mean(snapshot) + (x - snapshot)

that is, each member keeps the local update it made since the snapshot and replaces the snapshot
by the group's mean; all members of a group apply the same mean, and with no local update the
result is exactly the mean (the bits blocking DS-Sync produces, one step later).

Staleness: one averaging (``every`` optimizer steps). The gradient of step t is taken at
parameters that have not yet received the previous averaging's mean; the average itself is of
parameters ``every`` steps old.

Why it still reaches consensus (the mixing-matrix view of DS-Sync): let ``s_t`` be the snapshot
of step t (stacked over ranks), ``W_t`` the block-diagonal, doubly stochastic averaging matrix of
step t's partition and ``u_t`` the local updates made between snapshots. The merge gives
``s_t = W_{t-1} s_{t-1} + u_t``: the same product of mixing matrices as blocking DS-Sync
(``s_t = W_t (s_{t-1} + u_t)``), with each update mixed one matrix later. With no gradient steps
the snapshots follow ``s_t = W_{t-1} s_{t-1}`` exactly, so any schedule whose product of matrices
contracts to the all-equal average (a butterfly after log2(n) steps, a shuffle in expectation)
reaches it, one step later. Because each ``W`` is doubly stochastic, the mean over ranks moves by
exactly the mean update, as in blocking DS-Sync.

Checkpoints: :meth:`Overlap.state_dict` waits for the average in flight (nothing is in flight while the
state is written) but does not merge it; it holds the snapshot and the means, and
:meth:`Overlap.load_state_dict` restores them, to be merged at the next averaging as they would have
been. So saving does not change the run, and a resumed run continues bit-exactly like one never
stopped (the checkpoint holds two extra copies of the averaged tensors). ``average_all``
finishes and merges it first. Each pending average is tagged with its own step (kind
``OVERLAP``), so ranks out of step raise ``SyncError``; a rank running blocking DS-Sync beside
overlapped ones is refused at construction (the start-up agreement compares ``overlap``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dssync.comm.lane import Lane, Pending
from dssync.comm.tags import OVERLAP
from dssync.comm.wire import Residuals
from dssync.errors import SyncError
from dssync.schedules.base import WHOLE, Part
from dssync.strategies.hooks import Averaging, Hook, Host, Target


class Overlap(Hook):
    """The average in flight of one DSSync: started on a :class:`Lane`, merged one averaging
    later; a :class:`~dssync.strategies.hooks.Hook` that defers.

    Example (what ``DSSync(overlap=True)`` does at each averaging)::

        overlap = Overlap(group, timeout_s, bucket_bytes, device, router.groups)
        overlap.merge(host)          # merge the previous average, if any (host.targets())
        overlap.around(ctx, average) # start this one on host.snapshot(); returns at once
    """

    name = "overlap"
    defers = True

    def __init__(
        self,
        process_group: dist.ProcessGroup | None,
        timeout_s: float,
        bucket_bytes: int,
        device: torch.device | None,
        groups: Any,
        wire: str = "fp32",
        residuals: Residuals | None = None,
        nonfinite: str = "raise",
    ) -> None:
        # The Router's made groups are lent: a strategy never averages on both at once.
        self.lane = Lane(
            process_group,
            timeout_s,
            bucket_bytes,
            device=device,
            groups=groups,
            wire=wire,
            nonfinite=nonfinite,
        )
        if residuals is not None:  # one error memory with the blocking path: average_all
            self.lane.router.residuals = residuals  # returns what the lane's encodings lost
        self._pending: tuple[Pending, list[torch.Tensor]] | None = None
        self._ready: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    @property
    def pending(self) -> bool:
        """True while an average is started or arrived but not yet merged."""
        return self._pending is not None or self._ready is not None

    def start(
        self,
        group: list[int],
        step: int,
        snapshot: list[torch.Tensor],
        part: Part = WHOLE,
        ranged: int = 0,
    ) -> None:
        """Start averaging ``snapshot`` (copies the caller keeps) with ``group``; returns at once.
        Its last ``ranged`` buffers keep their range on the wire (:meth:`Lane.start`)."""
        pending = self.lane.start(group, OVERLAP, step, snapshot, part, ranged=ranged)
        self._pending = (pending, snapshot)

    def around(self, ctx: Averaging, average: Callable[[], None]) -> None:
        """Start this averaging on a snapshot of the host's buffers and optimizer state
        (:meth:`Host.snapshot <dssync.strategies.hooks.Host.snapshot>`); returns at once."""
        snapshot, ranged = ctx.host.snapshot()
        self.start(ctx.group, ctx.t, snapshot, ctx.part, ranged=ranged)

    def merge(self, host: Host) -> bool:
        """Wait for the average in flight, if any, and merge it into the host's tensors."""
        if not self.pending:
            return False
        self.finish(host.targets(), host.averagings)
        return True

    def arrive(self) -> None:
        """Wait for the average in flight, if any, without merging it."""
        if self._pending is not None:
            pending, snapshot = self._pending
            self._pending = None
            self._ready = (snapshot, pending.wait())

    @torch.no_grad()
    def finish(self, targets: list[Target], step: int) -> None:
        """Wait for the average in flight, if any, and merge it: x <- mean + (x - snapshot)."""
        self.arrive()
        if self._ready is None:
            return
        snapshot, means = self._ready
        self._ready = None
        if [_numel(t) for t in targets] != [s.numel() for s in snapshot]:
            raise SyncError(
                f"the averaged tensors ({len(snapshot)} buffers) no longer match the model and "
                f"optimizer state ({len(targets)} buffers); keep the optimizer's state and the "
                "model's tensors in place between step() calls",
                step=step,
            )
        for target, snap, mean in zip(targets, snapshot, means, strict=True):
            if torch.is_tensor(target):
                target.sub_(snap).add_(mean)
                continue
            offset = 0
            for t in target:  # optimizer state: the tensors one packed buffer holds
                n = t.numel()
                t.sub_(snap[offset : offset + n].view_as(t))
                t.add_(mean[offset : offset + n].view_as(t))
                offset += n

    def close(self) -> None:
        """Stop the lane's worker and destroy its process group (every rank; merge first with
        :meth:`finish`)."""
        self.lane.close()
        dist.destroy_process_group(self.lane.group)

    def state_dict(self) -> dict[str, Any] | None:
        """The arrived, not yet merged average (snapshot and means), or None.

        The average in flight is waited for (the collective must not outlive the save) but not
        merged, so saving does not change the run.
        """
        self.arrive()
        if self._ready is None:
            return None
        return {"snapshot": self._ready[0], "means": self._ready[1]}

    def load_state_dict(self, ready: dict[str, Any] | None, host: Host | None = None) -> None:
        """The average to merge at the next averaging (call :meth:`finish` on one in flight first)."""
        self._ready = None if ready is None else (list(ready["snapshot"]), list(ready["means"]))


def _numel(target: Target) -> int:
    return target.numel() if torch.is_tensor(target) else sum(t.numel() for t in target)
