"""What a checkpoint holds for one rank, and putting it back.

:class:`RunState` is the loop's own progress (step, log, timers, SWA average);
:class:`Checkpointer` adds the model, optimizer, strategy and RNG states and writes or
restores them through :mod:`dssync.train.checkpoint`. The data order needs no saved state:
each epoch's order is a pure function of (seed, epoch, rank), and the step says where in it we are.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dssync.strategies import Strategy
from dssync.train.checkpoint import (
    CheckpointError,
    checkpoint_path,
    read_checkpoint,
    write_checkpoint,
)
from dssync.train.resume import agree_on_step, check_fits
from dssync.train.swa import WeightAverage


@dataclass
class RunState:
    """The training loop's progress: steps done, per-step log, evaluations, timers, SWA average."""

    step: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    compute_s: float = 0.0
    sync_s: float = 0.0
    train_s: float = 0.0
    swa: WeightAverage | None = None
    resumed_from: int | None = None


class Checkpointer:
    """Saves and restores one rank's full training state.

    Example::

        saver = Checkpointer("ckpt", rank, header, strategy, optimizer)
        run = saver.resume() or RunState()     # all ranks call resume()
        ...
        saver.save(run)                        # after a step
    """

    def __init__(self, folder: str | Path, rank: int, header: dict[str, Any], strategy: Strategy,
                 optimizer: torch.optim.Optimizer) -> None:
        self.folder = Path(folder)
        self.rank = rank
        self.header = header
        self.strategy = strategy
        self.optimizer = optimizer

    def save(self, run: RunState) -> Path:
        state = {
            "model": self.strategy.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "strategy": self.strategy.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
            "run": {k: v for k, v in vars(run).items() if k != "swa"},
            "swa": None if run.swa is None else {"model": run.swa.module.state_dict(), "count": run.swa.count},
        }
        return write_checkpoint(self.folder, self.rank, run.step, self.header, state)

    def resume(self) -> RunState | None:
        """Load the newest checkpoint every rank holds intact; None (start fresh) when there is none."""
        step = agree_on_step(self.folder, self.rank, self.header)
        if step is None:
            if self.rank == 0:
                print(f"no checkpoint in {self.folder} yet: starting fresh", file=sys.stderr, flush=True)
            return None
        path = checkpoint_path(self.folder, self.rank, step)
        header, state = read_checkpoint(path)
        check_fits(path, header, self.header)
        try:
            self.strategy.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.strategy.load_state_dict(state["strategy"])
        except (RuntimeError, KeyError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(
                f"checkpoint {path} does not fit this run ({first[:200]}); resume with the settings "
                "that wrote it, or use a new --checkpoint-dir"
            ) from None
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        run = RunState(**state["run"])
        if state["swa"] is not None:
            run.swa = WeightAverage(self.strategy.module)
            run.swa.module.load_state_dict(state["swa"]["model"])
            run.swa.count = state["swa"]["count"]
        run.resumed_from = step
        if self.rank == 0:
            print(f"resuming from step {step} ({path.parent})", file=sys.stderr, flush=True)
        return run
