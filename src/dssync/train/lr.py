"""Learning-rate schedules: the factor on the base rate as a pure function of the step.

Being a function of the step alone, a resumed run continues with the rate it would have had.
"""

from __future__ import annotations

import math

import torch

LR_SCHEDULES = ("constant", "cosine")


def lr_factor(kind: str, step: int, total: int) -> float:
    """Factor on the base learning rate for 0-based ``step`` of a ``total``-step run.

    ``cosine`` decays from 1 at step 0 towards 0 at the end (half a cosine period).
    """
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))
    raise ValueError(f"unknown learning-rate schedule {kind!r}; choose from {', '.join(LR_SCHEDULES)}")


class LRSchedule:
    """Sets every parameter group's rate to its initial rate times :func:`lr_factor`.

    Example::

        sched = LRSchedule(optimizer, "cosine", total=1000)
        sched.apply(step)   # before optimizer.step()
    """

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, total: int) -> None:
        lr_factor(kind, 0, total)  # reject an unknown kind now
        self.optimizer, self.kind, self.total = optimizer, kind, total
        self.base = [g["lr"] for g in optimizer.param_groups]

    def apply(self, step: int) -> float:
        """Set the rates for ``step``; returns the factor."""
        f = lr_factor(self.kind, step, self.total)
        for g, base in zip(self.optimizer.param_groups, self.base, strict=True):
            g["lr"] = base * f
        return f
