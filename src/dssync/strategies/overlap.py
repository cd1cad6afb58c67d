"""Overlapped DS-Sync: each step's group average runs while the next step computes.

Right after the optimizer step, :meth:`OverlapDSSync.step` copies the flat buckets (parameters
and floating buffers) and, when given, the optimizer's floating state into a snapshot and starts
this step's group average of the snapshot without blocking. The next forward and backward run
meanwhile. The average runs on a :class:`~dssync.comm.lane.Lane`: a process group and a thread
of its own, made at construction, so the pair exchange's chunk window keeps moving while the
caller computes and the caller's own traffic on the training group never interleaves with it. At the next ``step()`` the average is waited for and merged::

    x <- mean(snapshot) + (x - snapshot)

that is, each member keeps the local update it made since the snapshot and replaces the snapshot
by the group's mean; all members of a group apply the same mean, and with no local update the
result is exactly the mean (the bits blocking DS-Sync produces, one step later).

Staleness: one step. The gradient of step t is taken at parameters that have not yet received
step t-1's average; the average itself is of parameters one step old.

Why it still reaches consensus (the mixing-matrix view of DS-Sync): let ``s_t`` be the snapshot
of step t (stacked over ranks), ``W_t`` the block-diagonal, doubly stochastic averaging matrix of
step t's partition and ``u_t`` the local updates made between snapshots. The merge gives
``s_t = W_{t-1} s_{t-1} + u_t``: the same product of mixing matrices as blocking DS-Sync
(``s_t = W_t (s_{t-1} + u_t)``), with each update mixed one matrix later. With no gradient steps
the snapshots follow ``s_t = W_{t-1} s_{t-1}`` exactly, so any schedule whose product of matrices
contracts to the all-equal average (a butterfly after log2(n) steps, a shuffle in expectation)
reaches it, one step later. Because each ``W`` is doubly stochastic, the mean over ranks moves by
exactly the mean update, as in blocking DS-Sync.

Checkpoints: :meth:`state_dict` waits for the average in flight (nothing is in flight while the
state is written) but does not merge it; it holds the snapshot and the means, and
:meth:`load_state_dict` restores them, to be merged at the next ``step()`` as they would have
been. So saving does not change the run, and a resumed run continues bit-exactly like one never
stopped (the checkpoint holds two extra copies of the averaged tensors). :meth:`average_all`
finishes and merges it first. Each pending average is tagged with its own step (kind
``OVERLAP``), so ranks out of step raise ``SyncError``; a rank running blocking DS-Sync beside
overlapped ones is refused at construction (the start-up agreement compares the sync method).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from dssync.comm import FlatBuckets
from dssync.comm.buckets import pack, plan_buckets
from dssync.comm.lane import OVERLAP, Lane, Pending
from dssync.errors import SyncError, UsageError
from dssync.schedules import group_of
from dssync.schedules.base import WHOLE, Part
from dssync.schedules.topology import SPREAD, plan_topology_aware
from dssync.strategies.base import SyncTimer
from dssync.strategies.dssync import DSSync
from dssync.topology import Topology


class OverlapDSSync(DSSync):
    """DS-Sync whose group averages run behind the next step's compute (merged one step later).

    Takes the arguments of :class:`DSSync`. ``sync_time`` (the ``sync`` column) is what the
    averaging still costs the training loop: waiting for the previous average, merging it, and
    copying and posting the next.

    Example (under torchrun or :func:`dssync.launch.spawn`)::

        sync = OverlapDSSync(model, schedule=Shuffle(2, seed=0), optimizer=opt)
        for x, y in loader:
            loss_fn(model(x), y).backward()
            opt.step(); opt.zero_grad()
            sync.step()              # merge the previous average, start this step's
        sync.average_all()           # finishes the pending one, then one global average
    """

    name = "dssync-overlap"

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(module, *args, **kwargs)
        first = self._buckets.buffers[0] if self._buckets.buffers else None
        self.lane = Lane(
            self.process_group,
            self.timeout_s,
            self.bucket_bytes,
            device=None if first is None else first.device,
            groups=self.router.groups,  # lent: this strategy never averages on both at once
            wire=self.wire,
        )
        # one error memory for both paths: average_all returns what the lane's encodings lost
        self.lane.router.residuals = self.router.residuals
        self._pending: tuple[Pending, list[torch.Tensor]] | None = None
        self._ready: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    @property
    def pending(self) -> bool:
        """True while an average is started or arrived but not yet merged."""
        return self._pending is not None or self._ready is not None

    def _step(self) -> None:
        with SyncTimer(self):
            self.finish()
            group = group_of(self.schedule.partition(self.steps, self.world_size), self.rank)
            if len(group) > 1:
                self._start(group, self.schedule.part(group, self.steps, self.world_size))
            self.steps += 1
            self._advanced()

    @torch.no_grad()
    def _start(self, group: list[int], part: Part = WHOLE) -> None:
        if not self._buckets.intact():
            warnings.warn(
                "the module's tensors were replaced since DSSync wrapped it (e.g. by .to()); "
                "re-laying them into buckets. Move the model before wrapping to avoid this.",
                stacklevel=4,
            )
            self._buckets = FlatBuckets(self._tensors(), self.bucket_bytes)
        snapshot = [b.clone() for b in self._buckets.buffers]
        snapshot += [flat for flat, _ in pack(self._optimizer_state(), self.bucket_bytes)]
        pending = self.lane.start(group, OVERLAP, self.steps, snapshot, part)
        self._pending = (pending, snapshot)

    def _arrive(self) -> None:
        """Wait for the average in flight, if any, without merging it."""
        if self._pending is not None:
            pending, snapshot = self._pending
            self._pending = None
            self._ready = (snapshot, pending.wait())

    def _targets(self) -> list[torch.Tensor | list[torch.Tensor]]:
        """What a merge updates: the flat buckets, then the optimizer state packed alike."""
        state = plan_buckets(self._optimizer_state(), self.bucket_bytes)
        return [*self._buckets.buffers, *state]

    @torch.no_grad()
    def finish(self) -> None:
        """Wait for the average in flight, if any, and merge it: x <- mean + (x - snapshot)."""
        self._arrive()
        if self._ready is None:
            return
        snapshot, means = self._ready
        self._ready = None
        targets = self._targets()
        if [_numel(t) for t in targets] != [s.numel() for s in snapshot]:
            raise SyncError(
                f"the averaged tensors ({len(snapshot)} buffers) no longer match the model and "
                f"optimizer state ({len(targets)} buffers); keep the optimizer's state and the "
                "model's tensors in place between step() calls",
                step=self.steps,
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
        """Finish and merge the pending average, then stop the lane's worker (every rank)."""
        self.finish()
        self.lane.close()

    @torch.no_grad()
    def average_all(self) -> None:
        """Finish the pending average, then one global average over all ranks."""
        with SyncTimer(self):
            self.finish()
        super().average_all()

    def state_dict(self) -> dict[str, Any]:
        """The schedule step and the arrived, not yet merged average (snapshot and means).

        The average in flight is waited for (the collective must not outlive the save) but not
        merged, so saving does not change the run; the model and optimizer are saved as they are.
        """
        self._arrive()
        ready = (
            None if self._ready is None else {"snapshot": self._ready[0], "means": self._ready[1]}
        )
        return {**super().state_dict(), "overlap": ready}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step and the average to merge at the next :meth:`step`."""
        self.finish()  # one already in flight completes so the group's messages stay matched
        super().load_state_dict(state)
        ready = state.get("overlap")
        self._ready = None if ready is None else (list(ready["snapshot"]), list(ready["means"]))


def _numel(target: torch.Tensor | list[torch.Tensor]) -> int:
    return target.numel() if torch.is_tensor(target) else sum(t.numel() for t in target)


class TopoOverlapDSSync(OverlapDSSync):
    """Overlapped DS-Sync on a fixed :class:`TopologyAware` plan made from ``topology`` at start.

    Unlike :class:`AdaptiveDSSync` it does not re-plan from timings: an overlapped average hides
    its own transfer time, so the timings re-planning reads are not measured here.

    Example (under torchrun or :func:`dssync.launch.spawn`)::

        from dssync.topology import detect
        sync = TopoOverlapDSSync(model, detect(probe=True), optimizer=opt)
    """

    name = "dssync-topo-overlap"

    def __init__(
        self,
        module: nn.Module,
        topology: Topology | None = None,
        max_every: int = 8,
        group_size: int = 2,
        seed: int = 0,
        spread: bool = SPREAD,
        **kwargs: Any,
    ) -> None:
        if max_every < 1:
            raise UsageError(
                f"max_every={max_every} must be >= 1 (longest gap between crossings); try 8"
            )
        if topology is None:
            from dssync.topology import detect

            topology = detect()
        self.topology = topology
        schedule = plan_topology_aware(
            topology, group_size, seed, max_every=max_every, spread=spread
        )
        super().__init__(module, schedule=schedule, **kwargs)
