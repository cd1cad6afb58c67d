"""Starting workers: local processes on this machine, or the environment torchrun sets.

:func:`spawn` runs ``fn(*args)`` in ``world_size`` local processes joined in one gloo process
group on loopback. It forwards the first worker exception with its traceback and kills every
worker when one fails or when ``timeout_s`` passes, so nothing it starts can hang.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from queue import Empty
from typing import Any

import torch
import torch.distributed as dist

from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError


def core_share(workers: int, cores: int | None = None) -> int:
    """Intra-op threads for each of ``workers`` processes that share this machine's cores.

    The one rule every worker dssync starts on one machine follows (local processes here, every
    host of an emulated cluster): its share of the cores, at least one. Torch's default (every
    core in every process) makes N workers on C cores run N*C compute threads that fight for C
    cores, and the compute time, not the network, then sets the pace. Workers torchrun starts on
    real machines are left as the user set them.
    """
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, workers))


class WorkerError(RuntimeError):
    """A worker failed: ``rank`` is the first rank that failed, ``detail`` its traceback or exit code.

    ``exc_types`` names the classes of the worker's exception, its own first and then every base
    (``module.QualName``, the class's MRO), so the parent can classify it as it would the exception
    itself; it is empty when the worker died or hung without raising. ``message`` is its text.
    """

    def __init__(
        self, rank: int, detail: str, exc_types: tuple[str, ...] = (), message: str = ""
    ) -> None:
        super().__init__(f"worker rank {rank} failed:\n{detail}")
        self.rank = rank
        self.detail = detail
        self.exc_types = tuple(exc_types)
        self.message = message

    @property
    def exc_type(self) -> str:
        """The short name of the worker's exception class ("" when it raised none)."""
        return self.exc_types[0].rsplit(".", 1)[-1] if self.exc_types else ""


def class_names(e: BaseException) -> tuple[str, ...]:
    """``module.QualName`` of the class of ``e`` and of each of its bases, in MRO order."""
    return tuple(f"{c.__module__}.{c.__qualname__}" for c in type(e).__mro__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launched_externally() -> bool:
    """True when a launcher such as torchrun has set RANK and WORLD_SIZE for this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init_from_env(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the process group described by RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.

    ``timeout_s`` bounds every collective: a lost peer makes the others fail within it.
    """
    if dist.is_initialized():
        return
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def run_contained(
    cmd: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own, output captured; nothing it starts outlives it.

    When it ends, or when ``timeout`` seconds pass, everything it started is killed: its
    process group, and every process below it in sessions of their own (torchrun starts each
    rank in its own session, which a kill of the group misses); a timeout then raises
    :class:`TimeoutError` with the tail of its stderr.
    """
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        raise TimeoutError(
            f"`{' '.join(map(str, cmd))}` did not finish in {timeout:.0f} s; stderr:\n{err[-3000:]}"
        ) from None
    finally:
        _kill_session(proc.pid)  # leftovers of the session, if any
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def children(pid: int) -> list[int]:
    """The processes ``pid``'s threads started (from /proc), whatever their session."""
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:  # the thread or the process ended meanwhile
            continue
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children first found, whatever their session."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s session and every process below it. All are stopped first, so that
    none (torchrun's agent) starts another while they are found; then all are killed."""
    seen: list[int] = []
    for _ in range(3):  # stopped processes start nothing: a second look finds the last ones
        new = [p for p in [pid, *descendants(pid)] if p not in seen]
        if not new:
            break
        for p in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        seen += new
    _kill_session(pid)
    for p in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def exit_quietly(code: int) -> None:
    """End this worker process now, without interpreter finalization.

    Call it after the results are written and the process group is destroyed: gloo's worker
    threads can still abort the process (SIGABRT, "terminate called without an active exception")
    while the interpreter finalizes, which would turn a finished run into a failed one.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    collective_timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    backend: str = "gloo",
    tick: Callable[[], object] | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` local ranks; return each rank's result, by rank.

    ``fn`` must be importable (defined at module level). Each rank has joined the default
    process group (``backend``, gloo by default, on 127.0.0.1) before ``fn`` runs and leaves it after.
    ``tick()``, when given, is called in this thread about every 0.2 s while the ranks run (to
    report what they write as they go); what it raises stops every rank.

    Example::

        def rank_times_two():
            return dist.get_rank() * 2

        assert spawn(rank_times_two, 2) == [0, 2]
    """
    if world_size < 1:
        raise UsageError(f"world_size={world_size} must be >= 1; pass 1 or more")
    ctx = mp.get_context("spawn")
    results_q = ctx.Queue()
    base_env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        **(env or {}),
    }
    coll_timeout = collective_timeout_s or timeout_s
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, args, rank, base_env, coll_timeout, backend, results_q),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world_size:
            if tick is not None:
                tick()
            try:
                kind, rank, value = results_q.get(timeout=0.2)
            except Empty:
                _check_exits(procs, results)
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(results))
                    raise WorkerError(
                        missing[0],
                        f"timed out after {timeout_s:.0f}s; ranks {missing} did not finish",
                    ) from None
                continue
            if kind == "error":
                _raise_dead_first(procs, rank, value)
            results[rank] = _unpack(value)
        for p in procs:
            p.join(timeout=10)
    finally:
        _kill(procs)
    return [results[r] for r in range(world_size)]


def _pack(value: Any) -> bytes:
    # Plain bytes: tensors sent through a multiprocessing queue would travel as shared-memory
    # handles that die with the worker.
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _raise_dead_first(procs: list, reporter: int, report: tuple[str, tuple[str, ...], str]) -> None:
    """Raise for a rank that died (a peer's error is often only the echo of that death)."""
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        dead = [r for r, p in enumerate(procs) if r != reporter and p.exitcode not in (None, 0)]
        if dead:
            code = procs[dead[0]].exitcode
            echo = (report[2].strip().splitlines() or [*report[1][:1], "failed"])[0]
            raise WorkerError(
                dead[0],
                f"process exited with code {code}; rank {reporter} then reported:\n{report[0]}",
                (),
                f"died (exited with code {code}); rank {reporter} then reported: {echo[:160]}",
            )
        time.sleep(0.05)
    raise WorkerError(reporter, *report)


def _check_exits(procs: list, results: dict[int, Any]) -> None:
    for rank, p in enumerate(procs):
        if p.exitcode not in (None, 0) and rank not in results:
            raise WorkerError(
                rank, f"process exited with code {p.exitcode} before reporting a result"
            )


def _kill(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def _worker(
    fn: Callable[..., Any],
    args: tuple,
    rank: int,
    env: dict[str, str],
    timeout_s: float,
    backend: str,
    results_q,
) -> None:
    os.environ.update(env)
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    torch.set_num_threads(core_share(int(env["WORLD_SIZE"])))
    try:
        init_from_env(backend=backend, timeout_s=timeout_s)
        value = fn(*args)
        dist.barrier()  # nobody tears down the store while a peer still needs it
        results_q.put(("ok", rank, _pack(value)))
    except BaseException as e:  # noqa: BLE001 - forwarded to the parent with its traceback
        results_q.put(("error", rank, (traceback.format_exc(), class_names(e), str(e))))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
