"""The lab's training-loop protocol, on top of the library's :class:`~dssync.strategies.Strategy`.

The library's strategies take ``step()`` after the optimizer's step and ``average_all()`` at the
end; the lab's loop also calls something after ``backward()`` (a baseline such as hierarchical
all-reduce or the parameter server acts there), times each synchronization, and skips the
parameter average before an evaluation when every rank's replicas are bitwise equal (DDP). The
loop calls the functions here on any strategy; a baseline derives from :class:`LabStrategy`.

Example::

    time_sync(strategy)                 # every synchronization from now on is timed
    loss.backward(); after_backward(strategy); optimizer.step(); strategy.step()
    seconds = take_sync_time(strategy)  # since the last call
"""

from __future__ import annotations

from dssync.comm.clock import clock, module_device
from dssync.strategies.base import Strategy


class SyncTimer:
    """Context manager that adds its elapsed time to a strategy's sync time: what
    :func:`time_sync` sets as the strategy's ``on_sync`` observer.

    On a GPU it waits for the device at both ends, so the time is that of the work itself, not of
    queueing it (:func:`dssync.comm.clock.clock`): a cost only a run that asked for timings pays.
    """

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.device = module_device(strategy.module)

    def __enter__(self) -> SyncTimer:
        self.t0 = clock(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        s = self.strategy
        s._sync_s = getattr(s, "_sync_s", 0.0) + clock(self.device) - self.t0


def time_sync(strategy: Strategy, on: bool = True) -> None:
    """Time each synchronization of ``strategy`` from now on (:func:`take_sync_time`); on a GPU
    every timed synchronization waits for the device at both ends."""
    strategy.on_sync = SyncTimer if on else None


def _taken(strategy: Strategy) -> float:
    t = getattr(strategy, "_sync_s", 0.0)
    strategy._sync_s = 0.0  # type: ignore[attr-defined]
    return t


def take_sync_time(strategy: Strategy) -> float:
    """Seconds ``strategy`` spent synchronizing since the last call (0 unless timed)."""
    if isinstance(strategy, LabStrategy):
        return strategy.take_sync_time()
    return _taken(strategy)


def after_backward(strategy: Strategy) -> None:
    """What ``strategy`` does after ``loss.backward()``, before the optimizer's step (a
    baseline's :meth:`LabStrategy.after_backward`; nothing for the library's strategies)."""
    if isinstance(strategy, LabStrategy):
        strategy.after_backward()


def replicas_equal(strategy: Strategy) -> bool:
    """True where every rank's parameters are bitwise equal after every step (DDP and its
    hooks), so an evaluation need not average them first."""
    return bool(getattr(strategy, "replicas_equal", False))


class LabStrategy(Strategy):
    """A baseline behind the lab's loop: the library's interface, with the loop's protocol."""

    # True where every rank's parameters are bitwise equal after every step (DDP and its
    # hooks), so an evaluation need not average them first.
    replicas_equal = False

    def after_backward(self) -> None:
        """Called after ``loss.backward()``, before the optimizer step."""

    def time_sync(self, on: bool = True) -> None:
        """Time each synchronization from now on (:func:`time_sync`)."""
        time_sync(self, on)

    def take_sync_time(self) -> float:
        """Seconds spent synchronizing since the last call (0 unless timed)."""
        return _taken(self)


__all__ = [
    "LabStrategy",
    "SyncTimer",
    "after_backward",
    "replicas_equal",
    "take_sync_time",
    "time_sync",
]
