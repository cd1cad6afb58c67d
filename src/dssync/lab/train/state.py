"""What a checkpoint holds for one rank, and putting it back, with the same or another world size.

:class:`RunState` is the loop's own progress (step, log, timers); :class:`Checkpointer` adds the
model, optimizer, strategy, SWA average and RNG states and writes or restores them through
:mod:`dssync.lab.train.checkpoint`. Everything saved is tensors and plain data, so checkpoints load
with ``weights_only=True``. The data order needs no saved state: each epoch's order is a pure
function of (seed, epoch, rank), and the step says where in it we are.

Elastic resume: a run written by N workers and resumed by M != N starts every rank from the mean
of the N saved models (parameters and floating buffers; integer buffers from saved rank 0), the
mean of their optimizer states (momentum and the like; the rest from saved rank 0) and the mean of
their SWA averages. The step continues, the partition schedule is derived for M from it and the
rate schedule continues from it. RNG states are re-seeded from (step, rank). Steps per epoch
change with the world size, so the saved step may fall inside an epoch of M workers: rank 0 then
says how many samples of that epoch are skipped (the next epoch starts whole).

Run identity: a :class:`Checkpointer` chooses one at construction (rank 0's, shared), a resume
replaces it by the one its checkpoint records, and every file written carries it with its rank
and step, so a file of another run or another rank is refused on load
(:mod:`dssync.lab.train.resume`).
"""

from __future__ import annotations

import random
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dssync.comm.meta import from_first
from dssync.comm.side import side_group
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import SyncError
from dssync.lab.train.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from dssync.lab.train.resume import agree_on_step, check_fits, check_own, saved_files
from dssync.lab.train.swa import WeightAverage
from dssync.strategies import Strategy


@dataclass
class RunState:
    """The training loop's progress: steps done, per-step log, evaluations, timers.

    ``train_s`` adds up the timed steps; ``loop_s`` is read from the clock around the whole loop.
    """

    step: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    compute_s: float = 0.0
    sync_s: float = 0.0
    train_s: float = 0.0
    loop_s: float = (
        0.0  # wall time of the loop, steps and all between them (evaluation, checkpoints)
    )
    resumed_from: int | None = None


@dataclass
class Resumed:
    """What :meth:`Checkpointer.resume` restored: the loop's progress and the SWA average, if any."""

    run: RunState
    swa: WeightAverage | None


class Checkpointer:
    """Saves and restores one rank's full training state.

    Example::

        saver = Checkpointer("ckpt", rank, world, header, strategy, optimizer)
        found = saver.resume()                 # all ranks call resume(); None: start fresh
        ...
        saver.save(run, swa)                   # after a step
    """

    def __init__(
        self,
        folder: str | Path,
        rank: int,
        world: int,
        header: dict[str, Any],
        strategy: Strategy,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        self.folder = Path(folder)
        self.rank, self.world = rank, world
        # The run identity: chosen at the first start, kept by every resume (:meth:`resume`),
        # written in every file and checked on load (a file of another run is refused).
        timeout_s = getattr(strategy, "timeout_s", DEFAULT_TIMEOUT_S)
        self.header = {**header, "run": new_run_id(timeout_s)}
        self.strategy = strategy
        self.optimizer = optimizer

    def save(self, run: RunState, swa: WeightAverage | None) -> Path:
        state = {
            "model": self.strategy.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "strategy": self.strategy.state_dict(),
            "rng": _rng_state(),
            "run": {k: v for k, v in vars(run).items()},
            "swa": None if swa is None else swa.state_dict(),
        }
        return write_checkpoint(self.folder, self.rank, run.step, self.header, state)

    def resume(self) -> Resumed | None:
        """Load the newest checkpoint complete on disk; None (start fresh) when there is none."""
        found = agree_on_step(self.folder, self.rank, self.header)
        if found is None:
            if self.rank == 0:
                print(
                    f"no checkpoint in {self.folder} yet: starting fresh",
                    file=sys.stderr,
                    flush=True,
                )
            return None
        step, saved_world = found
        paths = saved_files(self.folder, step, saved_world)
        if saved_world == self.world:
            header, state = self._read(paths[self.rank])
        else:
            read = [self._read(p) for p in paths]
            header = read[0][0]
            state = _merge([st for _, st in read], base=self.rank % saved_world)
            state["rng"] = None
        resumed = self._restore(paths[self.rank % saved_world], state, step)
        if header.get("run") is not None:  # the run goes on under its own identity
            self.header["run"] = header["run"]
        if self.rank == 0:
            how = (
                "" if saved_world == self.world else f", written by {saved_world} workers, averaged"
            )
            print(f"resuming from step {step} ({self.folder}{how})", file=sys.stderr, flush=True)
            if saved_world != self.world and (line := self._skipped(step, saved_world)):
                print(line, file=sys.stderr, flush=True)
        return resumed

    def _skipped(self, step: int, saved_world: int) -> str | None:
        """On another world size the step continues, so it may fall inside an epoch of this
        world's: the samples of that epoch before it are not visited, said aloud."""
        per_epoch, batch = self.header.get("steps_per_epoch"), self.header.get("batch_size")
        if not per_epoch or not batch:
            return None
        epoch, into = divmod(step, per_epoch)
        if not into:
            return None
        return (
            f"note: step {step}, written by {saved_world} workers, is batch {into} of "
            f"{per_epoch} of epoch {epoch} on {self.world} workers: this epoch skips its first "
            f"{into * self.world * batch} samples ({into} batches of {batch} on each worker) and "
            "the next epoch starts whole"
        )

    def _read(self, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        header, state = read_checkpoint(path)
        check_fits(path, header, self.header)
        check_own(path, header)
        return header, state

    def _restore(self, path: Path, state: dict[str, Any], step: int) -> Resumed:
        swa = None
        try:
            self.strategy.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.strategy.load_state_dict(state["strategy"])
            if state["swa"] is not None:
                swa = WeightAverage(self.strategy.module)
                swa.load_state_dict(state["swa"])
        except SyncError:
            raise  # ranks out of step or a lost peer while loading: not the checkpoint's fault
        except (RuntimeError, KeyError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(
                f"checkpoint {path} does not fit this run ({first[:200]}); resume with the settings "
                "that wrote it, or use a new --checkpoint-dir"
            ) from None
        if state["rng"] is None:
            _seed_rng(step * 1009 + self.rank)
        else:
            _set_rng_state(state["rng"])
        run = RunState(**state["run"])
        run.resumed_from = step
        return Resumed(run, swa)


def new_run_id(timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """A fresh run identity, rank 0's, on every rank (collective on the side group, bounded)."""
    mine = uuid.uuid4().hex[:16]
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    return from_first(mine, side_group(), timeout_s, "choosing the run identity")


def _merge(states: list[dict[str, Any]], base: int) -> dict[str, Any]:
    """``states[base]`` with the model, optimizer and SWA states' floating tensors averaged over
    ``states`` (integer tensors and other values from saved rank 0)."""
    merged = dict(states[base])
    for key in ("model", "optimizer", "swa"):
        if states[0][key] is not None:
            merged[key] = _mean([s[key] for s in states])
    return merged


def _mean(trees: list[Any]) -> Any:
    first = trees[0]
    if isinstance(first, torch.Tensor):
        if not first.is_floating_point():
            return first
        return torch.stack([t.to(torch.float64) for t in trees]).mean(0).to(first.dtype)
    if isinstance(first, dict):
        return type(first)((k, _mean([t[k] for t in trees])) for k in first)
    if isinstance(first, list):
        return [_mean(list(items)) for items in zip(*trees, strict=True)]
    return first


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }


def _set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(_tuples(rng["python"]))
    n = rng["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, list | tuple) else x


def _seed_rng(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
