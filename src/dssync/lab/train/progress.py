"""Rank 0's progress through a run: a bar on a terminal, a plain line per tenth of the run elsewhere.

On a terminal (stderr is a TTY) tqdm draws a bar that redraws in place. Piped or captured output
(a CI log, ``nohup``, ``| tee``) gets no bar, whose carriage returns would fill the log, but one
plain line each time the run passes another tenth of its steps: step/total, epoch, loss and the
seconds since the loop started. ``enabled=False`` (``--quiet``) prints neither; other ranks never
print.

Example::

    progress = Progress(total=620, steps_per_epoch=62, label="dssync mnist")
    for step in range(1, 621):
        progress.update(step, loss)   # 10 lines when piped: steps 62, 124, ..., 620
    progress.close()
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import TextIO

from dssync.lab.config import TrainConfig

LINES = 10  # plain lines per run (one per tenth)
FALLBACK_COLUMNS = 80  # the bar's width on a terminal that does not say its own


def _columns(stream: TextIO) -> int:
    """The terminal's width behind ``stream``; 0 where it is unknown (a pty nobody sized: tqdm's
    own measure then draws a bar of no width, so nothing shows)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


class Progress:
    """A tqdm bar on a terminal, else a line each time ``step`` passes another tenth of ``total``.

    ``done`` is the step the run starts from (a resumed run); ``terminal`` overrides the TTY test
    of ``stream`` (stderr by default).
    """

    def __init__(
        self,
        total: int,
        steps_per_epoch: int,
        label: str = "",
        done: int = 0,
        enabled: bool = True,
        stream: TextIO | None = None,
        terminal: bool | None = None,
    ) -> None:
        self.total, self.steps_per_epoch, self.label = total, max(steps_per_epoch, 1), label
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0
        self.start = time.monotonic()
        self.tenth = done * LINES // total if total else 0
        self.bar = None
        if self.enabled and (self.stream.isatty() if terminal is None else terminal):
            from tqdm import tqdm

            width = _columns(self.stream)
            self.bar = tqdm(
                total=total,
                initial=done,
                desc=label,
                unit="step",
                leave=False,
                dynamic_ncols=width > 0,
                ncols=None if width > 0 else FALLBACK_COLUMNS,  # a pty of unknown size says 0
                file=self.stream,
            )

    @classmethod
    def of(
        cls, cfg: TrainConfig, rank: int, total: int, done: int, steps_per_epoch: int
    ) -> Progress:
        """Rank 0's progress for ``cfg`` (silent on other ranks and with ``cfg.progress`` off)."""
        return cls(
            total,
            steps_per_epoch,
            label=f"{cfg.sync} {cfg.workload}",
            done=done,
            enabled=rank == 0 and cfg.progress,
        )

    def update(self, step: int, loss: float) -> None:
        """After ``step`` (1-based) with its training ``loss``."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}")
            return
        tenth = step * LINES // self.total
        if tenth > self.tenth:
            self.tenth = tenth
            print(self.line(step, loss), file=self.stream, flush=True)

    def line(self, step: int, loss: float) -> str:
        """``dssync mnist: step 62/620 (10%), epoch 1/10, loss 0.4123, 3.1 s``."""
        epoch = (step - 1) // self.steps_per_epoch + 1
        epochs = math.ceil(self.total / self.steps_per_epoch)
        head = f"{self.label}: " if self.label else ""
        return (
            f"{head}step {step}/{self.total} ({100 * step // self.total}%), "
            f"epoch {epoch}/{epochs}, loss {loss:.4f}, {time.monotonic() - self.start:.1f} s"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
