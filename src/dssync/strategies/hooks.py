"""The hook points of an averaging: how an option acts around one without touching DSSync.

An option that acts around an averaging (the outer step, overlap, re-planning, the Adam
correction of ``average_grads``) is a :class:`Hook`: it overrides the points it needs, and
:class:`~dssync.strategies.dssync.DSSync` calls every hook at each point, in a loop, in the
order the hooks were made. A hook sees the :class:`Averaging` it acts around and, through its
``host``, the small surface of :class:`Host`; it never reads or assigns the host's private
state.

The points of one averaging, in order::

    on_send(ctx)             the model is what this averaging sends
    before_merge(host)       a mean is about to land in the model
    around(ctx, average)     the transfer: call average() or run it another way
    after_merge(host)        the mean landed
    after_average(ctx)       the averaging is counted (host.averagings is ctx.t + 1)

With an overlapped average (a hook whose ``defers`` is True) the mean of averaging ``t`` lands
at averaging ``t + 1`` (or at :meth:`DSSync.finish <dssync.strategies.dssync.DSSync.finish>`):
there ``before_merge``, the deferring hook's :meth:`Hook.merge` and ``after_merge`` run first,
then ``on_send`` and ``around`` of the new averaging, which starts the transfer and returns.

Example: a hook that counts the averagings with more than one member::

    >>> from dssync.strategies.hooks import Averaging, Hook
    >>> class Count(Hook):
    ...     def __init__(self):
    ...         self.n = 0
    ...     def around(self, ctx, average):
    ...         self.n += len(ctx.group) > 1
    ...         average()
    >>> count, done = Count(), []
    >>> count.around(Averaging(None, 0, [0, 1]), lambda: done.append(True))
    >>> count.n, done
    (1, [True])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from dssync.schedules import Schedule
from dssync.schedules.base import WHOLE, Part

Target = torch.Tensor | list[torch.Tensor]  # a flat bucket, or the tensors one packed buffer holds


class Host(Protocol):
    """What a hook may use of the DSSync it serves (all public on
    :class:`~dssync.strategies.dssync.DSSync`)."""

    world_size: int
    rank: int
    process_group: dist.ProcessGroup | None
    timeout_s: float
    steps: int
    every: int
    averagings: int
    schedule: Schedule
    router: Any  # the averaging core (:class:`dssync.comm.averager.Router`)

    def current_group(self) -> list[int]: ...

    def use_schedule(self, schedule: Schedule) -> None: ...

    def targets(self) -> list[Target]: ...

    def snapshot(self) -> tuple[list[torch.Tensor], int]: ...


@dataclass
class Averaging:
    """One averaging: its index ``t`` (0, 1, ...), this rank's ``group``, the ``part`` of every
    buffer it averages (:class:`~dssync.schedules.Fragments`), on ``host``; ``deferred``: its
    mean lands at the next averaging, not before this one returns (``overlap=True``)."""

    host: Any
    t: int
    group: list[int]
    part: Part = WHOLE
    deferred: bool = False


class Hook:
    """An option acting around an averaging, at declared points; each point does nothing here.

    ``name`` is the key of the hook's state in ``DSSync.state_dict()`` (``""``: it keeps none);
    ``defers`` is True for a hook whose :meth:`around` starts the transfer and returns, the mean
    landing later through :meth:`merge` (at most one hook of a DSSync defers).
    """

    name = ""
    defers = False

    def on_start(self, host: Host) -> None:
        """Every rank holds the same model: after the start-up broadcast and ``average_all()``."""

    def on_send(self, ctx: Averaging) -> None:
        """An averaging starts: the model is what it sends (before :meth:`around`)."""

    def travels(self) -> list[torch.Tensor]:
        """Tensors that travel with the blocking average besides the model and the optimizer's
        state (each is averaged in place)."""
        return []

    def around(self, ctx: Averaging, average: Callable[[], None]) -> None:
        """Run the transfer: ``average()`` is the next hook's :meth:`around` (the innermost is
        the blocking average). A hook may time it, or (``defers``) run it another way."""
        average()

    def before_merge(self, host: Host) -> None:
        """A mean is about to land in the model (blocking: before the transfer)."""

    def merge(self, host: Host) -> bool:
        """Land a deferred mean now, if any; True when one landed (``defers`` only)."""
        return False

    def after_merge(self, host: Host) -> None:
        """The mean landed in the model."""

    def after_average(self, ctx: Averaging) -> None:
        """The averaging is counted (``host.averagings == ctx.t + 1``)."""

    def state_dict(self) -> Any:
        """The hook's state for ``DSSync.state_dict()`` (under :attr:`name`)."""
        return None

    def load_state_dict(self, state: Any, host: Host) -> None:
        """Continue from :meth:`state_dict`'s ``state`` (every rank alike)."""

    def close(self) -> None:
        """Release what the hook holds (after its last averaging)."""


class WireMemory(Hook):
    """What a compressed ``wire`` owes the next averages (its error feedback, kept by the
    host's router), in the host's checkpoints.

    Example::

        >>> from dssync.comm.wire import Residuals
        >>> WireMemory("int8", Residuals()).state_dict()["format"]
        'int8'
    """

    name = "wire"

    def __init__(self, wire: str, residuals: Any) -> None:
        self.wire, self.residuals = wire, residuals

    def state_dict(self) -> dict[str, Any]:
        return {"format": self.wire, **self.residuals.state_dict()}

    def load_state_dict(self, state: dict[str, Any], host: Host | None = None) -> None:
        self.residuals.load_state_dict(state)
