"""Faults injected into training runs, for tests only: hooks passed to ``run_training``.

Hook classes live here (a module, not a test file) so that local workers can unpickle them.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import torch.distributed as dist

from dssync.lab.train import StepHook

CRASH_EXIT_CODE = 3


class CrashAfter(StepHook):
    """Rank ``rank`` exits abruptly (code 3) after ``step`` steps, once.

    "Once" means: not after a torchrun restart, and not when ``marker_dir`` holds the marker this
    writes before exiting.
    """

    def __init__(self, rank: int, step: int, marker_dir: str | None = None) -> None:
        self.rank, self.step, self.marker_dir = rank, step, marker_dir

    def after_step(self, rank: int, step: int) -> None:
        if rank != self.rank or step != self.step:
            return
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        if self.marker_dir is not None:
            marker = Path(self.marker_dir) / f".crashed-rank{rank}"
            if marker.exists():
                return
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"crashed after step {step}\n")
        os._exit(CRASH_EXIT_CODE)


def note_fault(log_dir: str | None, rank: int) -> None:
    """Write when the fault happened to ``log_dir/rank{R}.json`` (if given)."""
    if log_dir is not None:
        Path(log_dir, f"rank{rank}.json").write_text(json.dumps({"fault_at": time.time()}))


class DieBeforeSending(StepHook):
    """Rank ``rank`` exits with ``exit_code`` after its backward pass of ``step``, before it sends
    anything; with ``log_dir`` it first notes the time."""

    def __init__(
        self, rank: int, step: int, exit_code: int = CRASH_EXIT_CODE, log_dir: str | None = None
    ) -> None:
        self.rank, self.step, self.exit_code, self.log_dir = rank, step, exit_code, log_dir

    def before_sync(self, rank: int, step: int) -> None:
        if rank == self.rank and step == self.step:
            note_fault(self.log_dir, rank)
            os._exit(self.exit_code)


class InsideCollective(StepHook):
    """From ``step`` on, rank ``rank`` acts inside its next collective call.

    ``mode="die"``: the rank starts the collective (its first bytes go out) and exits before it
    completes. ``mode="slow"``: the rank sleeps ``sleep_s`` inside the call before taking part.
    Every collective ``torch.distributed`` offers as a module function is wrapped, so this works
    whatever collective the strategy uses.
    """

    NAMES = (
        "all_reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "batch_isend_irecv",
        "send",
        "recv",
    )  # not isend/irecv: P2POp checks that its op *is* torch's own (batch_isend_irecv is wrapped)

    def __init__(
        self,
        rank: int,
        step: int,
        mode: str,
        sleep_s: float = 60.0,
        exit_code: int = CRASH_EXIT_CODE,
        log_dir: str | None = None,
    ) -> None:
        self.rank, self.step, self.mode, self.sleep_s = rank, step, mode, sleep_s
        self.exit_code, self.log_dir = exit_code, log_dir
        self.armed = False

    def started(self, rank: int, strategy) -> None:
        if rank != self.rank:
            return
        for name in self.NAMES:
            if hasattr(dist, name):
                setattr(dist, name, self._wrap(getattr(dist, name)))

    def before_sync(self, rank: int, step: int) -> None:
        self.armed = rank == self.rank and step >= self.step

    def _wrap(self, fn):
        def wrapper(*args, **kwargs):
            if not self.armed:
                return fn(*args, **kwargs)
            self.armed = False
            note_fault(self.log_dir, self.rank)
            if self.mode == "slow":
                time.sleep(self.sleep_s)
                return fn(*args, **kwargs)
            if "async_op" in fn.__code__.co_varnames:
                kwargs["async_op"] = True
            fn(*args, **kwargs)  # started, not waited for
            threading.Event().wait(0.2)  # let the first bytes leave
            os._exit(self.exit_code)

        return wrapper


class KilledWhileWriting(StepHook):
    """Rank ``rank`` is killed (SIGKILL) while it writes its checkpoint of ``step``, once.

    The checkpoint's bytes are in its temporary file, not yet synced nor renamed into place: what
    a kill, a power cut or an OOM kill leaves in the middle of a write. "Once": not when
    ``marker_dir`` holds the marker this writes first.
    """

    def __init__(self, rank: int, step: int, marker_dir: str) -> None:
        self.rank, self.step, self.marker_dir = rank, step, marker_dir

    def started(self, rank: int, strategy) -> None:
        import dssync.lab.train.state as state

        if rank != self.rank:
            return
        real = state.write_checkpoint

        def write(folder, r, step, *args, **kwargs):
            marker = Path(self.marker_dir) / f".killed-rank{r}"
            if step == self.step and not marker.exists():
                marker.write_text(f"killed while writing step {step}\n")
                os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # mid-write
            return real(folder, r, step, *args, **kwargs)

        state.write_checkpoint = write
