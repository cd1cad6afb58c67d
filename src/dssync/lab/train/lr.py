"""Learning-rate schedules: the factor on the base rate as a pure function of the step.

Being a function of the step alone, a resumed run continues with the rate it would have had.
"""

from __future__ import annotations

import math

import torch

from dssync.errors import UsageError

LR_SCHEDULES = ("constant", "cosine", "warmup-cosine")
WARMUP = 0.1  # warmup-cosine: the fraction of the run spent warming up


def lr_factor(kind: str, step: int, total: int) -> float:
    """Factor on the base learning rate for 0-based ``step`` of a ``total``-step run.

    ``cosine`` decays from 1 at step 0 towards 0 at the end (half a cosine period);
    ``warmup-cosine`` rises linearly over the first :data:`WARMUP` of the run, then decays so
    (as transformers are trained, with Adam's early steps kept small).
    """
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))
    if kind == "warmup-cosine":
        warm = max(int(WARMUP * total), 1)
        if step < warm:
            return (step + 1) / warm
        return lr_factor("cosine", step - warm, total - warm)
    raise ValueError(
        f"unknown learning-rate schedule {kind!r}; choose from {', '.join(LR_SCHEDULES)}"
    )


class LRSchedule:
    """Sets every parameter group's rate to its initial rate times :func:`lr_factor`.

    Example::

        sched = LRSchedule(optimizer, "cosine", total=1000)
        sched.apply(step)   # before optimizer.step()

    With ``hold_from`` and ``hold_lr`` every group's rate is ``hold_lr`` from step ``hold_from`` on
    (the constant rate of stochastic weight averaging's phase).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        kind: str,
        total: int,
        hold_from: int | None = None,
        hold_lr: float | None = None,
    ) -> None:
        lr_factor(kind, 0, total)  # reject an unknown kind now
        if (hold_from is None) != (hold_lr is None):
            raise UsageError("hold_from and hold_lr go together; give both or neither")
        self.optimizer, self.kind, self.total = optimizer, kind, total
        self.hold_from, self.hold_lr = hold_from, hold_lr
        self.base = [g["lr"] for g in optimizer.param_groups]

    def apply(self, step: int) -> None:
        """Set the rates for ``step``."""
        held = self.hold_from is not None and step >= self.hold_from
        f = lr_factor(self.kind, step, self.total)
        for g, base in zip(self.optimizer.param_groups, self.base, strict=True):
            g["lr"] = self.hold_lr if held else base * f
