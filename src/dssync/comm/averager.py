"""The averaging core: one routine that averages flat buffers inside a group of ranks.

:class:`Router` is made once per parent process group. Given this step's group (ranks of the
parent group), it hands the buffers to the one transport (:class:`~dssync.comm.transport.
Transport`) and tells it whether a collective may carry them, with no process group created
after construction:

* the whole parent group: a collective on the parent group itself;
* a group of a repeating schedule with more than two members: a collective on a group made at
  construction (when the parent group is the world; see :meth:`Router.prepare`), at most
  ``max_groups`` of them (a long cycle of larger groups would otherwise hold thousands);
* anything else (pairs, groups beyond the cap, groups of a schedule that never repeats), and
  every average on a compressed wire: point to point on the parent group.

``pairs="all_reduce"`` makes pairs groups too (a repeating schedule's pairs, or every pair of the
world for a schedule of pairs that never repeats, within the cap), so that the two paths can be
compared in the same run (``dssync bench --method dssync-allreduce``); the default exchange path
needs no group per pair at any world size.

On nccl the first point-to-point operation of a communicator must not come before any
collective, so a Router on a group that is not gloo (nccl, the ``nccl_like`` test backend)
runs one all_reduce of one element on ``device`` (the parameters' device; by default the
current CUDA device) at construction.

Every call carries a :class:`~dssync.comm.tags.Tag` (kind, step, bucket layout, and whether every
value this rank sends is finite), compared on the device, and every wait is bounded by
``timeout_s`` (see :mod:`dssync.comm.transport`). A "no" (tags that differ, or a member whose
values are not finite) leaves every member with the values it had, residuals included: where
the host has the verdict without waiting (the CPU) the transfer stops before anything received
is used; on a device the Router keeps copies and selects them back on the device
(``torch.where``), and reads the verdict when its copy to the host is done, at the latest at the
next averaging. Nothing in a steady-state averaging reads the device on the host.
``nonfinite="raise"`` then raises :class:`~dssync.errors.SyncError` on every member (the rank
at fault names itself, the step and the tensor; the others name it); ``"skip"`` warns once and
goes on; ``"spread"`` does not look (as DDP: a NaN reaches the group), which saves one read
of the buffers per averaging.
Tensors that already are flat bucket views (``DSSync``'s parameters) are averaged in place;
others (optimizer state, a torch averager's parameters) are packed, averaged in the same call,
and unpacked: one flatten/reduce/copy routine for every strategy.

:class:`GroupAverager` is this core in the shape of PyTorch's model averagers
(``torch.distributed.algorithms.model_averaging``).
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager
from torch.distributed.algorithms.model_averaging.utils import get_params_to_average

from dssync.comm.buckets import DEFAULT_BUCKET_BYTES, pack, unpack
from dssync.comm.devices import check_device, local_device
from dssync.comm.exchange import RollCall, wait
from dssync.comm.inflight import lend
from dssync.comm.tags import (
    ALL,
    AVERAGER,
    Tag,
    Verdict,
    finite_of,
    first_nonfinite,
    layout_of,
    reads_free,
)
from dssync.comm.transport import DEFAULT_CHUNK_BYTES, Transport
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.comm.wire import Residuals, codec_for, ranged_codec
from dssync.errors import SyncError, UsageError
from dssync.schedules import Schedule, Shuffle, group_of
from dssync.schedules.base import WHOLE, Part, part_slice

MAX_GROUPS = 256  # process groups one Router makes at most; beyond, groups go point to point
PAIRS = ("exchange", "all_reduce")
# what a Router does when a member's values are not finite ("spread": it does not look)
NONFINITE = ("raise", "skip", "spread")


class Router:
    """Averages buffers inside this step's group of ranks of ``process_group``.

    Every rank of the parent group makes a Router at the same point (it may create the groups of
    a repeating schedule). ``created`` counts the process groups it made; it only grows in
    :meth:`prepare`, never while averaging. ``inband=False`` sends a pair's tag in a message of its
    own even where it could ride in the data's (:class:`~dssync.comm.transport.Transport`), so that
    :attr:`arrived` is set after every average with a peer.

    Example::

        router = Router(None, Shuffle(3, seed=0, repeat=8))
        router.average([0, 2, 5], kind=STEP, step=4, tensors=list(model.parameters()))
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        schedule: Schedule | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        pairs: str = "exchange",
        max_groups: int = MAX_GROUPS,
        device: torch.device | None = None,
        wire: str = "fp32",
        inband: bool = True,
        nonfinite: str = "raise",
    ) -> None:
        if nonfinite not in NONFINITE:
            raise UsageError(
                f"nonfinite={nonfinite!r}: choose 'raise' (stop with SyncError), 'skip' (keep "
                "every member's own values for that averaging and go on) or 'spread' (no check, "
                "as DDP: a NaN reaches the group)"
            )
        self.nonfinite = nonfinite
        self._warned = False
        # names the element ``index`` of the averaged buffer ``i`` for an error (DSSync sets it)
        self.names = None
        self._unread: tuple[Verdict, list[torch.Tensor]] | None = None
        self.codec = codec_for(wire)
        self.ranged_codec = ranged_codec(wire)
        self.residuals = Residuals()  # the error memory of a compressed wire
        if pairs not in PAIRS:
            raise UsageError(f"pairs={pairs!r}: choose one of {', '.join(PAIRS)}")
        if not timeout_s or timeout_s <= 0:
            raise UsageError(
                f"timeout_s={timeout_s!r} must be a positive number of seconds; "
                f"the default is {DEFAULT_TIMEOUT_S:g}"
            )
        self.parent = process_group if process_group is not None else dist.group.WORLD
        self.size = dist.get_world_size(self.parent)
        self.rank = dist.get_rank(self.parent)
        self.timeout_s = float(timeout_s)
        self.bucket_bytes = bucket_bytes
        self.transport = Transport(self.parent, chunk_bytes, inband=inband)
        self.roll = RollCall(self.parent)  # finds the missing ranks of a failed collective
        self.groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        self._elsewhere: set[tuple[int, ...]] = set()
        self.created = 0
        self.arrived: float | None = None  # when the last average's members had all come
        self.pairs = pairs
        self.max_groups = max_groups
        backend = dist.get_backend(self.parent)
        if backend == dist.Backend.NCCL and device is None:
            device = local_device()
        check_device(backend, device)
        if backend != dist.Backend.GLOO:  # nccl and the like
            self._first_collective(device)
        if schedule is not None:
            self.prepare(schedule)

    def _first_collective(self, device: torch.device | None) -> None:
        """One all_reduce of a tag on the parent group, before any point-to-point op."""
        first = Tag(ALL, -1, 1).signed(device or "cpu")  # a tag's shape: strict backends take it
        lend([first])
        work = dist.all_reduce(first, op=dist.ReduceOp.MAX, group=self.parent, async_op=True)
        members = list(range(self.size))
        wait(
            work,
            time.monotonic() + self.timeout_s,
            Tag(ALL, -1, 1),
            members,
            self.timeout_s,
            process_group=self.parent,
        )

    def prepare(self, schedule: Schedule) -> None:
        """Make the groups of more than two ranks (and pairs, with ``pairs="all_reduce"``) that
        ``schedule`` uses (collective).

        Every rank of the world calls ``new_group`` for every such group, in one sorted order
        (groups made with ``use_local_synchronization`` by overlapping sets of ranks were seen to
        deadlock in gloo's connection set-up). Inside a parent group that is not the world, whose
        outsiders cannot join in, those groups average point to point instead. Once the Router
        holds ``max_groups`` groups it makes no more: the rest average point to point.
        """
        if self.parent is not dist.group.WORLD:
            return
        smallest = 2 if self.pairs == "all_reduce" else 3
        room = max(self.max_groups - len(self.groups) - len(self._elsewhere), 0)
        new: list[tuple[int, ...]] = []  # in order of first use, so a long cycle stops early
        for key in self._wanted(schedule, smallest):
            if len(new) >= room:
                break
            if key not in self.groups and key not in self._elsewhere and key not in new:
                new.append(key)
        for key in sorted(new):
            pg = dist.new_group(list(key), timeout=timedelta(seconds=self.timeout_s))
            self.created += 1
            if self.rank in key:
                self.groups[key] = pg
            else:
                self._elsewhere.add(key)

    def close(self) -> None:
        """Destroy the groups :meth:`prepare` made (every rank alike); it averages no more."""
        for pg in self.groups.values():
            dist.destroy_process_group(pg)
        self.groups.clear()
        self._elsewhere.clear()

    def _wanted(self, schedule: Schedule, smallest: int) -> Iterator[tuple[int, ...]]:
        """Groups worth making for ``schedule``, in order of first use (the same on every rank)."""
        cycle = schedule.cycle(self.size)
        if cycle is not None:
            for s in range(cycle):
                for g in schedule.partition(s, self.size):
                    if smallest <= len(g) < self.size:
                        yield tuple(g)
        elif smallest == 2 and all(len(g) <= 2 for g in schedule.partition(0, self.size)):
            yield from itertools.combinations(range(self.size), 2)  # pairs that never repeat

    def average(
        self,
        group: Sequence[int],
        kind: int,
        step: int,
        buffers: Sequence[torch.Tensor] = (),
        tensors: Sequence[torch.Tensor] = (),
        part: Part = WHOLE,
        ranged: Sequence[torch.Tensor] = (),
    ) -> None:
        """Average ``buffers`` (flat, in place) and ``tensors`` (packed) with ``group`` (tagged).

        ``part`` = (index, parts) averages only that slice of every flat buffer (the schedule's
        :meth:`~dssync.schedules.Schedule.part`); the tag's layout carries the slice's sizes, so
        members that disagree on the slice are caught as a step mismatch. ``ranged`` tensors
        (packed, after ``tensors``) hold values spanning many orders of magnitude, such as
        Adam's second moment: a compressed wire sends them in a format that keeps their range
        (:data:`~dssync.comm.wire.RANGED`: bf16 on an int8 wire), never int8.
        """
        group = list(group)
        self.arrived = None
        self.settle()
        if len(group) < 2:
            return
        flats = pack(tensors, self.bucket_bytes) if tensors else []
        flats_ranged = pack(ranged, self.bucket_bytes) if ranged else []
        whole = list(buffers) + [f for f, _ in flats]
        codecs = [self.codec] * len(whole) + [self.ranged_codec] * len(flats_ranged)
        whole += [f for f, _ in flats_ranged]
        every = whole
        residuals = self.residuals.like(every) if self.codec.name != "fp32" else []
        device = every[0].device if every else torch.device("cpu")
        made = len(group) == self.size or tuple(group) in self.groups  # a collective's group
        # what a "no" must give back, where the transfer cannot stop before it changes it: on
        # the CPU both paths read the verdict before any value changes (Transport.average),
        # but a global average on a lossy wire adds the residuals in first (below)
        exact = bool(residuals) and kind == ALL
        keep = every if exact or not reads_free(device) else []
        saved = [t.clone() for t in [*keep, *residuals]]
        kept = [*keep, *residuals]
        if residuals and kind == ALL:  # one exact average: what the encodings lost comes back
            for b, e in zip(every, residuals, strict=True):
                b.add_(e)
                e.zero_()
            residuals = []
        if part != WHOLE:
            every = [b[part_slice(b.numel(), part)] for b in every]
            residuals = [e[part_slice(e.numel(), part)] for e in residuals]
        collective = made and not residuals
        tag = Tag(kind, step, layout_of(every, part))
        # on the device; it travels in the tag ("spread": nothing read, every tag says finite)
        finite = finite_of(every) if self.nonfinite != "spread" else None
        made_pg = None
        if collective:
            made_pg = self.parent if len(group) == self.size else self.groups[tuple(group)]
        self.arrived, verdict = self.transport.average(
            every,
            group,
            tag,
            self.timeout_s,
            finite,
            codecs=codecs,
            residuals=residuals,
            collective=made_pg,
            roll=self.roll,
        )
        ok = verdict.known()
        if ok is None:  # on a device: select the kept values back there, read the verdict later
            for t, s in zip(kept, saved, strict=True):
                torch.where(verdict.go, t, s, out=t)
            self._unread = (verdict, whole)
        elif not ok:
            for t, s in zip(kept, saved, strict=True):
                t.copy_(s)
            self._refuse(verdict, whole)
            return  # skipped: packed tensors keep their own values
        unpack(flats)
        unpack(flats_ranged)

    def settle(self) -> None:
        """Read the verdict of the last averaging if it was left on the device, and raise what
        it says (waits for its copy to the host if that is not done; called at the next
        averaging, and where a caller already waits)."""
        if self._unread is None:
            return
        verdict, buffers = self._unread
        self._unread = None
        if not verdict.ok():
            self._refuse(verdict, buffers)

    def _refuse(self, verdict: Verdict, buffers: list[torch.Tensor]) -> None:
        """Raise (or, for non-finite values with ``nonfinite="skip"``, warn once about) a
        verdict that said no; the values were kept (host reads: this is the error path)."""
        error = verdict.out_of_step()
        if error is not None:
            raise error
        bad, tag, group = verdict.nonfinite(), verdict.tag, verdict.group
        if self.nonfinite == "skip":
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"rank(s) {bad} had non-finite values at {tag.describe()}: group {group} "
                    "skipped that averaging, each member kept its own values (nonfinite='skip'; "
                    "said once)",
                    stacklevel=4,
                )
            return
        if self.rank in bad:
            found = first_nonfinite(buffers)
            if found is None:
                where = "values so large that their sum overflows float32"
            elif self.names is not None:
                where = self.names(*found)
            else:
                where = f"buffer {found[0]}, element {found[1]}"
            raise SyncError(
                f"non-finite values on this rank (rank {self.rank}) at {tag.describe()}, in "
                f"{where}: group {group} skipped that averaging and no value left this rank; "
                "find where the NaN or Inf came from (learning rate, loss scale, data), or pass "
                "nonfinite='skip' to go on without averaging such steps",
                step=tag.index,
                group=group,
                ranks=[self.rank],
            )
        who = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {bad}"
        raise SyncError(
            f"{who} of group {group} had non-finite values at {tag.describe()}: this rank "
            f"(rank {self.rank}) kept its own values and the averaging was skipped; see {who}'s "
            "error for the tensor, or pass nonfinite='skip' to go on without averaging such steps",
            step=tag.index,
            group=group,
            ranks=bad,
        )


class GroupAverager(ModelAverager):
    """A torch model averager that averages inside each step's group of a DS-Sync schedule.

    ``average_parameters(params)`` takes ``model.parameters()`` or ``optimizer.param_groups``
    (parameters without a gradient are left alone, as with PyTorch's averagers); from
    ``warmup_steps`` on, each call averages with this step's group of ``schedule`` and ``step``
    counts the calls. ``GroupAverager(Global())`` averages exactly as
    ``PeriodicModelAverager(period=1)``. It works wherever a ``ModelAverager`` does, including
    ``PostLocalSGDOptimizer`` (whose state_dict saves and restores ``step``).

    As PyTorch's averagers, it averages parameters only (no buffers, no optimizer state),
    averages nothing during ``warmup_steps`` (PyTorch's design runs DDP then), and does not
    start the ranks from rank 0's weights: it sees the parameters only when asked to average
    them, and a run resumed from a checkpoint must not be reset to rank 0's model. Start the
    ranks from one model yourself (the same seed, DDP during the warm-up, or one
    ``dist.broadcast`` of each tensor); ``DSSync`` does that at construction.

    Example (under torchrun or :func:`dssync.lab.launch.spawn`)::

        from torch.distributed.optim import PostLocalSGDOptimizer
        averager = GroupAverager(Shuffle(2, seed=0), warmup_steps=10)
        opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), averager)
        for x in batches:
            model(x).sum().backward(); opt.step(); opt.zero_grad()
    """

    def __init__(
        self,
        schedule: Schedule | None = None,
        process_group: dist.ProcessGroup | None = None,
        warmup_steps: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        super().__init__(process_group)
        if warmup_steps < 0:
            raise UsageError(
                f"warmup_steps={warmup_steps} must be >= 0 (steps before averaging starts)"
            )
        self.schedule = schedule if schedule is not None else Shuffle(2)
        self.warmup_steps = warmup_steps
        self.member = not dist._rank_not_in_group(self.process_group)
        self.router = (
            Router(self.process_group, self.schedule, timeout_s, bucket_bytes)
            if self.member
            else None
        )

    def average_parameters(self, params: Iterable[torch.nn.Parameter] | Iterable[dict]) -> None:
        """Average with this step's group (from ``warmup_steps`` on), then count the step."""
        if self.router is not None and self.step >= self.warmup_steps:
            tensors = get_params_to_average(params)
            size, rank = self.router.size, self.router.rank
            group = group_of(self.schedule.partition(self.step, size), rank)
            part = self.schedule.part(group, self.step, size)
            with torch.no_grad():
                self.router.average(group, AVERAGER, self.step, tensors=tensors, part=part)
        self.step += 1
