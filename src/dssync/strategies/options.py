"""DSSync's settings as one frozen object, declared once.

:class:`Options` is what ``DSSync``, its doors (``dssync.lightning``, ``dssync.accelerate``), the
start-up agreement, ``state_dict`` and the lab's method table read. A field is an option
everywhere: ``DSSync(model, every=4)`` is ``DSSync(model, options=Options(every=4))``, and the
doors take the same keywords.

Example::

    >>> from dssync import Options
    >>> local = Options(every=4, wire="int8")
    >>> local.replace(every=8).describe()
    "every=8, wire='int8'"
    >>> Options(every=0).check()
    Traceback (most recent call last):
    ...
    dssync.errors.UsageError: every=0 must be >= 1 (optimizer steps per averaging); try 1 or 4

Examples, one per option (they run as doctests; :func:`dssync.testing.one_rank` is a process
group of one rank in this process, so ``Global()`` is its one group)::

    >>> import torch
    >>> from dssync import DSSync, Global, Shuffle, nesterov, plan_topology_aware
    >>> from dssync.schedules import Fragments, group_of
    >>> from dssync.testing import one_rank
    >>> from dssync.topology import Topology

``schedule``: rank 0's group at averagings 0, 1 and 2 of four ranks (the same on every rank):

    >>> pairs = Shuffle(2, seed=0)
    >>> [group_of(pairs.partition(t, 4), 0) for t in range(3)]
    [[0, 2], [0, 3], [0, 3]]

``topology``: the schedule is ``plan_topology_aware(topology, max_every=8)``; two hosts of two
ranks average inside each host and cross between them every few averagings:

    >>> topo = Topology(hosts=(0, 0, 1, 1), racks=(0, 0, 1, 1))
    >>> plan = plan_topology_aware(topo, max_every=8)
    >>> plan.partition(1, 4), plan.partition(4, 4)
    ([[0, 1], [2, 3]], [[0], [1, 2], [3]])
    >>> Options(topology=topo, schedule=pairs).check()
    Traceback (most recent call last):
    ...
    dssync.errors.UsageError: pass topology= or schedule=, not both: ...

``every``: one averaging every 4th optimizer step:

    >>> with one_rank():
    ...     sync = DSSync(torch.nn.Linear(2, 1), Global(), every=4)
    ...     for _ in range(8):
    ...         sync.step()
    ...     sync.steps, sync.averagings
    (8, 2)

``outer``: the outer optimizer steps the anchor by the pseudo-gradient; at rate 0.5 the
parameters go half way from the anchor (0) to the averaged ones (2):

    >>> with one_rank():
    ...     model = torch.nn.Linear(2, 1, bias=False)
    ...     _ = torch.nn.init.zeros_(model.weight)
    ...     sync = DSSync(model, Global(), outer=nesterov(lr=0.5, momentum=0.0))
    ...     with torch.no_grad():
    ...         _ = model.weight.add_(2.0)     # local steps
    ...     sync.step()
    ...     model.weight.tolist()
    [[1.0, 1.0]]

``overlap``: the average runs behind the next steps, merged at the next averaging or at
``finish()``; it cannot be timed, so not with ``replan``:

    >>> with one_rank():
    ...     sync = DSSync(torch.nn.Linear(2, 1), Global(), overlap=True)
    ...     sync.step(); sync.finish(); sync.close()
    ...     sync.pending
    False
    >>> Options(topology=topo, overlap=True, replan=8).check()
    Traceback (most recent call last):
    ...
    dssync.errors.UsageError: overlap=True with replan: an overlapped average hides ...

``replan``: re-plans a topology-aware plan, so it needs one:

    >>> Options(topology=topo, replan=8).check().replan
    8
    >>> Options(replan=8).check()
    Traceback (most recent call last):
    ...
    dssync.errors.UsageError: replan=8 re-plans a topology-aware plan, but the schedule is ...

``wire``: what travels; a compressed wire's error memory is in ``state_dict()``:

    >>> with one_rank():
    ...     sync = DSSync(torch.nn.Linear(2, 1), Global(), wire="int8")
    ...     sync.step()
    ...     sync.wire, sync.state_dict()["wire"]["format"]
    ('int8', 'int8')
    >>> Options(wire="int4").check()
    Traceback (most recent call last):
    ...
    dssync.errors.UsageError: wire='int4' is not a wire format; choose one of fp32, bf16, fp16, int8

``fragments``: one quarter of every buffer per averaging, in rotation, as ``(index, count)``:

    >>> quarters = Fragments(pairs, 4)
    >>> [quarters.part([0, 2], t, 4) for t in range(5)]
    [(0, 4), (1, 4), (2, 4), (3, 4), (0, 4)]

``average_grads``: on by default for an Adam-family optimizer, off for SGD (the same there):

    >>> params = torch.nn.Linear(2, 1).parameters()
    >>> Options().check(torch.optim.AdamW(params)).average_grads
    True
    >>> Options().check(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)).average_grads
    False

``bucket_bytes``: the largest flat buffer; a tensor larger than it (this weight's 4 KB) has a
buffer of its own, the bias another:

    >>> with one_rank():
    ...     DSSync(torch.nn.Linear(256, 4), Global(), bucket_bytes=1024).bucket_count
    2

``average_buffers``, ``average_frozen``: what is averaged besides the trainable parameters:

    >>> Options(average_buffers=False, average_frozen=True).describe()
    'average_buffers=False, average_frozen=True'

``broadcast_init``, ``timeout_s``, ``nonfinite``, ``pairs``: checked values:

    >>> Options(broadcast_init=False, timeout_s=30).describe()
    'broadcast_init=False, timeout_s=30'
    >>> Options(timeout_s=0).check()
    Traceback (most recent call last):
    ...
    dssync.errors.UsageError: timeout_s=0 must be a positive number of seconds; the default is 120
    >>> Options(nonfinite="ignore").check()
    Traceback (most recent call last):
    ...
    dssync.errors.UsageError: nonfinite='ignore': choose 'raise', 'skip' or 'spread'
    >>> Options(pairs="ring").check()
    Traceback (most recent call last):
    ...
    dssync.errors.UsageError: pairs='ring': choose 'exchange' or 'all_reduce'
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from dssync.comm.averager import NONFINITE
from dssync.comm.buckets import DEFAULT_BUCKET_BYTES
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.comm.wire import codec_for
from dssync.errors import UsageError
from dssync.schedules import Schedule
from dssync.strategies.before_step import is_adaptive
from dssync.strategies.outer import OuterFactory
from dssync.topology import Topology

PAIRS = ("exchange", "all_reduce")


def _agreed(meaning: str, fix: str | None = None) -> dict[str, str]:
    """Metadata of a field every rank must set alike: what it is, and the fix on a mismatch."""
    return {"meaning": meaning, "fix": fix or ""}


@dataclass(frozen=True)
class Options:
    """How :class:`~dssync.DSSync` averages. Every field is also a keyword of ``DSSync``.

    Args:
        schedule: which ranks average together at each averaging (default: random pairs; at an
            odd world size a pair and a rank alone, shuffled each time; above 16 ranks a cycle of
            2*ceil(log2 N) shuffles, so each rank meets a bounded set of peers:
            :func:`~dssync.schedules.default_schedule`).
        topology: hosts and racks of the ranks (:class:`~dssync.topology.Topology`): the schedule
            is then :func:`~dssync.schedules.topology.plan_topology_aware` of it, with crossings
            at most ``replan`` averagings apart (8 without re-planning). For other planner
            settings pass ``schedule=plan_topology_aware(...)`` instead.
        every: average after every ``every``-th optimizer step (H); ranks train locally in
            between. 1 is DS-Sync as in the paper.
        outer: a factory ``params -> torch.optim.Optimizer`` for an outer optimizer applied to
            the pseudo-gradient at each averaging (:func:`~dssync.strategies.outer.nesterov`:
            DiLoCo's; with ``Global()`` this is DiLoCo).
        overlap: run each average behind the next steps' compute and merge it at the next
            averaging (``x <- mean(snapshot) + (x - snapshot)``). Not with ``replan``. With
            ``outer``, the outer step is applied one averaging late, when the mean arrives.
        replan: re-plan the topology-aware plan every ``replan`` averagings from the measured
            sync times (0: never). Needs ``topology=`` (or a plan from ``plan_topology_aware``).
        wire: what travels: ``"fp32"`` (the buffers as kept), ``"bf16"``, ``"fp16"`` or
            ``"int8"`` (one scale per block of 1,024 elements), compressed with error feedback
            (:mod:`dssync.comm.wire`); Adam's second moment never travels as int8;
            ``average_all()`` is exact.
        fragments: average one of this many fragments of every buffer per averaging, in
            rotation (:class:`~dssync.schedules.Fragments`).
        average_grads: average inside ``optimizer.step()``, before it steps, with the gradients
            in the same message as the parameters (and the optimizer state when ``every`` > 1
            or with ``outer``; at ``every=1`` the moments stay per rank)
            (:mod:`~dssync.strategies.before_step`). None (default): on for an Adam-family
            ``optimizer=`` (not with ``overlap``). Costs the gradients' bytes.
        average_buffers: also average floating buffers (batch-norm running mean and variance).
        average_frozen: also average parameters with ``requires_grad=False`` (default: they are
            only broadcast from rank 0 at start, so they never drift).
        broadcast_init: start every rank from rank 0's parameters and buffers, as DDP does.
        bucket_bytes: the largest flat buffer one collective moves.
        timeout_s: the longest any averaging waits for a peer before raising ``PeerLost``.
        nonfinite: when a member's values are not finite no value leaves it and the group keeps
            its own values; ``"raise"`` then raises ``SyncError`` on every member (the rank at
            fault names the tensor), ``"skip"`` warns once and trains on. ``"spread"``: no check,
            as DDP; a NaN reaches the group (saves one read of the buffers per averaging: on a
            CPU shared by gloo ranks a tenth to a fifth of a pair's step, docs/design.md).
        pairs: how pairs average: ``"exchange"`` (point to point, no group per pair) or
            ``"all_reduce"`` (on pair groups made at construction; to compare the two paths).
    """

    schedule: Schedule | None = None
    topology: Topology | None = None
    every: int = field(default=1, metadata=_agreed("optimizer steps per averaging"))
    outer: OuterFactory | None = None
    overlap: bool = field(default=False, metadata=_agreed("averages behind the next steps"))
    replan: int = field(default=0, metadata=_agreed("averagings between re-plans"))
    wire: str = field(default="fp32", metadata=_agreed("what travels"))
    fragments: int = 1  # agreed through the schedule (Fragments wraps it)
    average_grads: bool | None = field(
        default=None, metadata=_agreed("average at the optimizer's step, gradients included")
    )
    average_buffers: bool = field(default=True, metadata=_agreed("floating buffers averaged"))
    average_frozen: bool = False  # agreed with the frozen set
    broadcast_init: bool = field(default=True, metadata=_agreed("start from rank 0's values"))
    bucket_bytes: int = field(default=DEFAULT_BUCKET_BYTES, metadata=_agreed("largest buffer"))
    timeout_s: float = DEFAULT_TIMEOUT_S
    nonfinite: str = field(default="raise", metadata=_agreed("what a NaN or Inf does"))
    pairs: str = field(default="exchange", metadata=_agreed("how pairs average"))

    def replace(self, **changes: Any) -> Options:
        """These options with ``changes`` (names checked: a typo is an error naming the field)."""
        _known(changes)
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """The fields that differ from the defaults, as keywords (``every=4, wire='int8'``)."""
        default = Options()
        return ", ".join(
            f"{f.name}={_show(getattr(self, f.name))}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        )

    def check(self, optimizer: torch.optim.Optimizer | None = None) -> Options:
        """These options with ``average_grads`` decided for ``optimizer``, or a
        :class:`~dssync.errors.UsageError` naming the value or pair that cannot work and the fix."""
        if self.every < 1:
            raise UsageError(
                f"every={self.every} must be >= 1 (optimizer steps per averaging); try 1 or 4"
            )
        if self.replan < 0:
            raise UsageError(
                f"replan={self.replan} must be >= 0 (averagings between re-plans; 0: off)"
            )
        if self.fragments < 1:
            raise UsageError(f"fragments={self.fragments} must be >= 1 (1: whole buffers)")
        if self.topology is not None and self.schedule is not None:
            raise UsageError(
                "pass topology= or schedule=, not both: topology= makes the schedule "
                "(plan_topology_aware(topology)); for other planner settings pass that schedule"
            )
        if self.replan and self.topology is None and not hasattr(self.schedule, "planned_from"):
            shown = "the default" if self.schedule is None else self.schedule.describe()
            raise UsageError(
                f"replan={self.replan} re-plans a topology-aware plan, but the schedule is "
                f"{shown}; pass topology= (or schedule=plan_topology_aware(...)), or replan=0"
            )
        if self.overlap and self.replan:
            raise UsageError(
                "overlap=True with replan: an overlapped average hides its transfer time, which "
                "is what re-planning measures; use one of them (replan=0, or overlap=False)"
            )
        if self.outer is not None and not callable(self.outer):
            raise UsageError(
                f"outer={self.outer!r} is not a factory params -> optimizer; pass one such as "
                "dssync.nesterov() (or None for no outer step)"
            )
        if self.timeout_s is None or not self.timeout_s > 0:
            raise UsageError(
                f"timeout_s={self.timeout_s!r} must be a positive number of seconds; the "
                f"default is {DEFAULT_TIMEOUT_S:g}"
            )
        if self.nonfinite not in NONFINITE:
            raise UsageError(f"nonfinite={self.nonfinite!r}: choose 'raise', 'skip' or 'spread'")
        if self.pairs not in PAIRS:
            raise UsageError(f"pairs={self.pairs!r}: choose 'exchange' or 'all_reduce'")
        codec_for(self.wire)  # names the formats on a wrong one
        return dataclasses.replace(self, average_grads=self._average_grads(optimizer))

    def _average_grads(self, optimizer: torch.optim.Optimizer | None) -> bool:
        if self.average_grads is None:
            return is_adaptive(optimizer) and not self.overlap
        if self.average_grads and optimizer is None:
            raise UsageError(
                "average_grads=True averages at the optimizer's step; pass optimizer= (the one "
                "whose step() follows backward), or average_grads=False"
            )
        if self.average_grads and self.overlap:
            raise UsageError(
                "average_grads=True averages before the optimizer steps, overlap=True behind "
                "the next steps; use one of them (average_grads=False, or overlap=False)"
            )
        return bool(self.average_grads)

    def agreement(self) -> dict[str, tuple[str, str]]:
        """What every rank must set alike, as ``{label: (value shown, fix)}`` for the start-up
        agreement (:func:`dssync.comm.agreement.check_start`)."""
        return {
            f"{f.name} ({f.metadata['meaning']})": (
                _show(getattr(self, f.name)),
                f.metadata["fix"] or f"pass the same {f.name}= on every rank",
            )
            for f in fields(self)
            if "meaning" in f.metadata
        }

    @classmethod
    def split(cls, settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``settings`` cut into this class's fields and the rest (a door's own keywords)."""
        names = {f.name for f in fields(cls)}
        ours = {k: v for k, v in settings.items() if k in names}
        return ours, {k: v for k, v in settings.items() if k not in names}


def _known(settings: Mapping[str, Any]) -> None:
    names = [f.name for f in fields(Options)]
    for k in settings:
        if k not in names:
            close = difflib.get_close_matches(k, names, n=1)
            hint = f"; did you mean {close[0]}=?" if close else f"; the options are {names}"
            raise TypeError(f"{k}= is not a DSSync option{hint}")


def options_of(options: Options | None, settings: Mapping[str, Any]) -> Options:
    """``options`` (default: all defaults) with ``settings`` (keywords of the same names) on top."""
    base = Options() if options is None else options
    if not isinstance(base, Options):
        raise UsageError(f"options={options!r} is not a dssync.Options; pass Options(...)")
    return base.replace(**settings) if settings else base


def _show(value: object) -> str:
    if isinstance(value, Schedule):
        return value.describe()
    return repr(value)
