"""Parameter-server training: ASP (never waits) and SSP (the fastest worker at most ``s`` steps ahead).

Design:

* **Where the server runs.** The server is a thread in the process of rank 0 (of the training
  group): the world size and the training loop stay as they are, and rank 0 is also a worker.
  On the emulated cluster it therefore runs on host 0, beside that host's workers, and every
  other worker's traffic crosses the links to host 0.
* **What it holds.** The master copy of the trained parameters, on the parameters' device, and an
  optimizer of the workers' class with the workers' parameter groups (momentum, weight decay...).
* **A step.** After backward a worker pushes its flat gradients with its clock (steps pushed so
  far) and each group's current learning rate, and in the same request asks for the parameters
  of its next step. The server applies every push at once, as one optimizer step at the pushing
  worker's rate divided by the number of workers N: a round of N pushes then moves the model as
  far as one synchronous step on the averaged gradient, so the same learning rate means the same
  for every method. After ``optimizer.step()`` the worker waits for the answer and overwrites its
  parameters with it (its local step is discarded). A missing gradient is pushed as zeros.
* **SSP.** The answer to a worker that has pushed clock c is sent once the slowest worker has
  pushed clock c - s (:func:`pull_due`): the fastest worker starts step t only when the slowest has
  finished step t - 1 - s, i.e. it runs at most ``s`` steps ahead. With s = 0 every worker waits
  for the whole round, and all get the same parameters: plain SGD then equals synchronous SGD
  on the averaged gradient (up to the order of float additions). ASP (``staleness=None``) answers
  at once, with whatever the master holds. Push and pull travel in one request so that the
  server handles them together: no later push can slip in between.
* **How bytes move.** Point-to-point on two gloo groups made once at construction over the ranks
  of the training group: requests (worker to server; the server thread receives them from any
  source) and answers (server to worker). Two groups, so that on rank 0 each has one user: the
  server thread receives, and answers are sent under the server's lock by whichever thread made
  them due. gloo, because it accepts CPU tensors and receives from any source, which nccl does
  neither; data is staged through host memory on both ends (a GPU model's gradients are copied to
  the host, sent, and copied to the server's device), so nothing goes through an nccl group but
  the start-up broadcast and the final buffer average, which carry parameter data on its device.
  Rank 0's own worker talks to its server in-process (a device copy, no message).
* **Waits.** Each wait is bounded. Rank 0 raises :class:`~dssync.errors.PeerLost` when it waits
  for others and the server has heard no push in ``timeout_s``, naming the ranks that hold it up
  (behind, and not waiting themselves), and answers every waiting worker with the same names.
  Under SSP every live worker, rank 0 included, ends up waiting within ``s`` steps of a death;
  under ASP they meet at the end. Another worker waits for an answer at most ``2 * timeout_s``
  (so that rank 0's bound, which knows who is behind, expires first), then names rank 0; at the
  end it asks every ``POLL_S`` whether all have finished and names the laggards itself after
  ``timeout_s`` without progress. The server thread waits for the next request for at most
  ``max(timeout_s, IDLE_S)``: all workers may go quiet together (a long evaluation) without
  anyone being stuck; it is a daemon thread, so a failed run never waits for it.
* **The end.** :meth:`ParameterServer.average_all` waits until every worker has pushed its last
  step, gives every worker the master's final parameters (so all ranks are identical), stops the
  server thread, and averages floating buffers (batch-norm statistics) over the training group.
  A later step starts a fresh server. A resumed run re-seeds the master from rank 0's model
  (the server's optimizer state is not checkpointed).

Example (under ``torchrun`` or :func:`dssync.lab.launch.spawn`)::

    strategy = ParameterServer(model, optimizer, staleness=2)   # SSP; staleness=None is ASP
    loss_fn(model(x), y).backward()
    strategy.after_backward()     # push gradients, ask for the next parameters
    optimizer.step()
    strategy.step()         # take the server's parameters
    strategy.average_all()        # every rank ends with the server's final parameters
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm.align import align_rest
from dssync.comm.exchange import broadcast_tensors
from dssync.comm.side import serving_process_group
from dssync.comm.transport import average_tensors
from dssync.comm.wait import DEFAULT_TIMEOUT_S, WaitFailed, wait_for
from dssync.errors import PeerLost, SyncError, UsageError
from dssync.lab.baselines.protocol import LabStrategy

PUSH, FINAL = 1.0, 2.0  # request kinds
OK, WAIT, DONE, ERROR = 0.0, 1.0, 2.0, 3.0  # answer kinds
IDLE_S = 3600.0  # longest the server waits for a request while nobody waits on it
POLL_S = 0.05  # how often a finished worker asks whether every other one has finished


def pull_due(clock: int, pushed: Sequence[int], staleness: int | None) -> bool:
    """Whether a worker that has pushed ``clock`` steps may start its next one (SSP's rule).

    Example::

        >>> pull_due(5, [5, 3, 4], staleness=2), pull_due(5, [5, 2, 4], staleness=2)
        (True, False)
    """
    return staleness is None or min(pushed) >= clock - staleness


def holding_up(behind: Sequence[int], waiting: Sequence[int]) -> list[int]:
    """The ranks a stalled wait blames: those ``behind`` that are not themselves ``waiting``."""
    idle = [r for r in behind if r not in waiting]
    return sorted(idle or behind)


class ParameterServer(LabStrategy):
    """ASP or SSP training through a parameter server in rank 0's process.

    Args:
        module: the model, on its device.
        optimizer: the workers' optimizer; the server builds one of the same class and groups.
        staleness: SSP's bound ``s`` (0: every worker waits for every round); None for ASP.
        process_group: the workers (default: all); its rank 0 also hosts the server.
        timeout_s: how long a waiting rank lets the others be silent before raising PeerLost.

    Example::

        strategy = ParameterServer(model, optimizer, staleness=None)   # ASP
    """

    name = "ps"

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        staleness: int | None = None,
        process_group: dist.ProcessGroup | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(module, process_group)
        if staleness is not None and staleness < 0:
            raise UsageError(f"staleness={staleness} must be >= 0 (0 waits every round)")
        if timeout_s <= 0:
            raise UsageError(f"timeout_s={timeout_s} must be positive")
        self.staleness = staleness
        self.timeout_s = timeout_s
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
        self.optimizer = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.kinds = _kinds(self.params)
        self.clock = 0
        self.requests = serving_process_group(self.ranks, max(timeout_s, IDLE_S))
        self.answers = serving_process_group(self.ranks, timeout_s)
        with torch.no_grad():
            broadcast_tensors(
                list(module.parameters()) + list(module.buffers()), 0, process_group, timeout_s
            )
        self._host = [torch.empty(sum(p.numel() for p in ps), dtype=d) for d, ps in self.kinds]
        self._back = [torch.empty_like(h) for h in self._host]  # the answer, beside the push
        self.server = _Server(self) if self.rank == 0 else None

    # --- the worker's side -------------------------------------------------------------------

    def _header(self, kind: float) -> torch.Tensor:
        lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        return torch.tensor([kind, self.clock, *lrs], dtype=torch.float64)

    def _grads(self) -> list[torch.Tensor]:
        return [
            torch.cat(
                [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps]
            )
            for _, ps in self.kinds
        ]

    @torch.no_grad()
    def after_backward(self) -> None:
        with self.syncing():
            self.clock += 1
            header = self._header(PUSH)
            if self.server is not None:
                self.server.start()
                self.server.push(0, self.clock, self._grads(), header[2:].tolist())
                return
            for host, flat in zip(self._host, self._grads(), strict=True):
                host.copy_(flat)
            server = self.ranks[0]
            self._sends = [
                dist.isend(t, server, group=self.requests) for t in [header, *self._host]
            ]
            self._answer = torch.empty(self.world_size + 3, dtype=torch.float64)
            self._recvs = [
                dist.irecv(t, server, group=self.answers) for t in [self._answer, *self._back]
            ]

    @torch.no_grad()
    def step(self) -> None:
        with self.syncing():
            if self.server is not None:
                self._take(self.server.pulled(self.clock))
                return
            for w in self._sends:
                self._wait(w, self.timeout_s, "push", self.requests)
            self._wait(self._recvs[0], 2 * self.timeout_s, "answer")
            for w in self._recvs[1:]:
                self._wait(w, self.timeout_s, "answer")
            self._check(self._answer)
            self._take(self._back)

    def _take(self, flats: Sequence[torch.Tensor]) -> None:
        """Overwrite the trained parameters with the server's (flat, per dtype)."""
        for flat, (_, ps) in zip(flats, self.kinds, strict=True):
            offset = 0
            for p in ps:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def _wait(self, work, timeout_s: float, what: str, group=None) -> None:
        """Wait for ``work`` on ``group`` (default: the answers' group) at most ``timeout_s``."""
        try:
            wait_for(work, time.monotonic() + timeout_s, group or self.answers)
        except WaitFailed as e:
            raise PeerLost(
                f"rank {self.rank} got no {what} through the parameter server (rank 0) at step "
                f"{self.clock} within {timeout_s:g} s: rank 0 died or stopped answering "
                f"({type(e).__name__}); rerun with --resume, or raise --timeout",
                step=self.clock,
                group=list(range(self.world_size)),
                ranks=[0],
            ) from e

    def _check(self, answer: torch.Tensor) -> None:
        if answer[0].item() == ERROR:
            raise _lost(self.rank, self.clock, _ranks(answer), self.timeout_s, self.world_size)

    @torch.no_grad()
    def average_all(self) -> None:
        """Every rank takes the master's final parameters; floating buffers are averaged."""
        with self.syncing():
            if self.server is not None:
                self._take(self.server.finish(self.clock))
            else:
                self._final()
            self.clock = 0
            buffers = [b for b in self.module.buffers() if b.is_floating_point()]
            if buffers:
                average_tensors(
                    buffers, self.process_group, self.world_size, timeout_s=self.timeout_s
                )
            align_rest(
                self.module,
                [*self.module.parameters(), *buffers],
                self.process_group,
                self.timeout_s,
            )

    def _final(self) -> None:
        """Ask the server, every POLL_S, whether every worker has finished; then take the master."""
        server, progress, since = self.ranks[0], None, time.monotonic()
        while True:
            answer = torch.empty(self.world_size + 3, dtype=torch.float64)
            request = dist.isend(self._header(FINAL), server, group=self.requests)
            self._wait(request, self.timeout_s, "final request", self.requests)
            self._wait(dist.irecv(answer, server, group=self.answers), self.timeout_s, "answer")
            self._check(answer)
            if answer[0].item() == DONE:
                for h in self._back:
                    self._wait(dist.irecv(h, server, group=self.answers), self.timeout_s, "answer")
                self._take(self._back)
                return
            if answer[1].item() != progress:
                progress, since = answer[1].item(), time.monotonic()
            elif time.monotonic() - since > self.timeout_s:
                raise _lost(self.rank, self.clock, _ranks(answer), self.timeout_s, self.world_size)
            time.sleep(POLL_S)

    def load_state_dict(self, state: dict) -> None:
        """A resumed run: the master restarts from rank 0's (just loaded) model."""
        if self.server is not None:
            self.server.reseed()


class _Server:
    """The master parameters, their optimizer, the clocks, and the thread that serves requests.

    Everything it holds is guarded by ``self.lock`` (a condition): the server thread and rank 0's
    own worker both change it.
    """

    def __init__(self, ps: ParameterServer) -> None:
        self.ps = ps
        self.n = ps.world_size
        self.lock = threading.Condition()
        self.index = {id(p): i for i, p in enumerate(ps.params)}
        self.master = [p.detach().clone() for p in ps.params]
        self.grads = [torch.zeros_like(m) for m in self.master]
        for m, g in zip(self.master, self.grads, strict=True):
            m.grad = g
        groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": [self.master[self.index[id(p)]] for p in g["params"]],
            }
            for g in ps.optimizer.param_groups
        ]
        self.optimizer = type(ps.optimizer)(groups, **ps.optimizer.defaults)
        self.out = {w: [torch.empty_like(h) for h in ps._host] for w in range(1, self.n)}
        self.own = [  # rank 0's own answer, on the device
            torch.empty(h.numel(), dtype=h.dtype, device=members[0].device)
            for h, (_, members) in zip(ps._host, ps.kinds, strict=True)
        ]
        self.thread: threading.Thread | None = None
        self._reset()

    def _reset(self) -> None:
        self.pushed = [0] * self.n
        self.pending: dict[int, int] = {}  # worker -> the clock it pushed, waiting for an answer
        self.answered: set[int] = set()  # rank 0's own pull, once answered
        self.final: set[int] = set()
        self.done: set[int] = set()
        self.inflight: dict[int, list] = {}
        self.error: PeerLost | None = None
        self.heard = time.monotonic()

    def reseed(self) -> None:
        with self.lock, torch.no_grad():
            for m, p in zip(self.master, self.ps.params, strict=True):
                m.copy_(p)

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, name="dssync-ps", daemon=True)
            self.thread.start()

    # --- the state machine (under the lock) ------------------------------------------------------

    @torch.no_grad()
    def push(
        self, worker: int, clock: int, flats: Sequence[torch.Tensor], lrs: Sequence[float]
    ) -> None:
        """Apply one worker's gradients, register its pull, and answer every pull now due."""
        with self.lock:
            if self.error is not None:
                raise self.error
            if clock != self.pushed[worker] + 1:
                raise SyncError(
                    f"rank {worker} pushed clock {clock} after {self.pushed[worker]}; every rank "
                    "must call after_backward and step once per step",
                    step=clock,
                    ranks=[worker],
                )
            for flat, (_, ps) in zip(flats, self.ps.kinds, strict=True):
                offset = 0
                for p in ps:
                    g = self.grads[self.index[id(p)]]
                    g.copy_(flat[offset : offset + p.numel()].view_as(g))
                    offset += p.numel()
            for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr / self.n
            self.optimizer.step()
            self.pushed[worker] = clock
            self.pending[worker] = clock
            self.heard = time.monotonic()
            self._answer_due()

    def _answer_due(self) -> None:
        for worker, clock in sorted(self.pending.items()):
            if pull_due(clock, self.pushed, self.ps.staleness):
                del self.pending[worker]
                self._send(worker, OK, self.own if worker == 0 else self.out[worker])
        self.lock.notify_all()

    def _send(self, worker: int, status: float, flats: list[torch.Tensor] | None, ranks=()) -> None:
        """Answer ``worker``: the master into ``flats`` (rank 0: in place), then the message."""
        if flats is not None and status in (OK, DONE):
            for w in self.inflight.pop(worker, []):
                self.ps._wait(w, self.ps.timeout_s, "answer sent")
            for flat, (_, ps) in zip(flats, self.ps.kinds, strict=True):
                flat.copy_(torch.cat([self.master[self.index[id(p)]].reshape(-1) for p in ps]))
        if worker == 0:
            self.answered.add(0)
            return
        header = torch.zeros(self.n + 3, dtype=torch.float64)
        header[0], header[1], header[2] = status, sum(self.pushed) + len(self.final), len(ranks)
        header[3 : 3 + len(ranks)] = torch.tensor(ranks, dtype=torch.float64)
        dst = self.ps.ranks[worker]
        works = [dist.isend(header, dst, group=self.ps.answers)]
        works += [dist.isend(f, dst, group=self.ps.answers) for f in flats or []]
        self.inflight.setdefault(worker, []).extend(works)

    def _fail(self, error: PeerLost) -> None:
        """Record ``error`` and answer every waiting worker with the ranks it names."""
        self.error = error
        for worker in sorted(self.pending):
            if worker != 0:
                self._send(worker, ERROR, self.out[worker], error.ranks)
        self.pending.clear()
        self.lock.notify_all()

    def _stall(self, behind: list[int]) -> PeerLost:
        waiting = [*self.pending, *self.final]
        ranks = holding_up(behind, waiting)
        return _lost(0, self.pushed[0], ranks, self.ps.timeout_s, self.n)

    def _wait_for(self, ready, behind) -> None:
        """Wait (rank 0's worker) until ``ready()``; PeerLost when no push came in timeout_s."""
        while not ready():
            if self.error is not None:
                raise self.error
            left = self.heard + self.ps.timeout_s - time.monotonic()
            if left <= 0:
                self._fail(self._stall(behind()))
                raise self.error
            self.lock.wait(timeout=min(left, 1.0))

    def pulled(self, clock: int) -> list[torch.Tensor]:
        """Rank 0's parameters for its next step, once the server has answered its pull."""
        with self.lock:
            need = clock - (self.ps.staleness or 0)
            self._wait_for(
                lambda: 0 in self.answered,
                lambda: [w for w in range(self.n) if self.pushed[w] < need],
            )
            self.answered.discard(0)
            return self.own

    def finish(self, clock: int) -> list[torch.Tensor]:
        """Rank 0 at the end: wait for every worker's last push, stop the thread, the master."""
        self.start()  # remote workers may ask even when rank 0 never stepped
        with self.lock:
            self.final.add(0)
            self.heard = time.monotonic()
            self._wait_for(
                lambda: len(self.final) == self.n,
                lambda: [w for w in range(self.n) if w not in self.final],
            )
            self._send(0, DONE, self.own)
        if self.thread is not None:
            self.thread.join(timeout=self.ps.timeout_s)
            if self.thread.is_alive():
                with self.lock:
                    late = [w for w in range(1, self.n) if w not in self.done]
                    raise _lost(0, clock, late, self.ps.timeout_s, self.n)
        with self.lock:
            for works in self.inflight.values():
                for w in works:
                    self.ps._wait(w, self.ps.timeout_s, "final answer sent")
            self.thread = None
            self._reset()
            self.answered.discard(0)
        return self.own

    # --- the thread ------------------------------------------------------------------------------

    def _serve(self) -> None:
        ps = self.ps
        if ps.params[0].device.type == "cuda":
            torch.cuda.set_device(ps.params[0].device)
        header = torch.empty(2 + len(ps.optimizer.param_groups), dtype=torch.float64)
        host = [torch.empty_like(h) for h in ps._host]
        try:
            while len(self.done) < self.n - 1:
                asked = dist.irecv(header, src=None, group=ps.requests)
                wait_for(asked, time.monotonic() + max(ps.timeout_s, IDLE_S), ps.requests)
                src = dist.get_global_rank(ps.requests, asked._source_rank())  # as recv gave
                worker = ps.ranks.index(src)
                kind, clock, lrs = header[0].item(), int(header[1].item()), header[2:].tolist()
                if kind == PUSH:
                    for h in host:
                        work = dist.irecv(h, src, group=ps.requests)
                        try:
                            wait_for(work, time.monotonic() + ps.timeout_s, ps.requests)
                        except WaitFailed as e:
                            raise _lost(0, clock, [worker], ps.timeout_s, self.n, e) from e
                    self._serve_push(worker, clock, host, lrs)
                else:
                    self._serve_final(worker)
        except PeerLost as e:
            with self.lock:
                self._fail(e)
        except Exception as e:  # noqa: BLE001 - a broken connection: every waiting rank hears it
            with self.lock:
                self._fail(_lost(0, self.pushed[0], [], ps.timeout_s, self.n, e))

    def _serve_push(self, worker: int, clock: int, host, lrs) -> None:
        flats = [
            h.to(members[0].device) for h, (_, members) in zip(host, self.ps.kinds, strict=True)
        ]
        try:
            self.push(worker, clock, flats, lrs)
        except SyncError as e:
            with self.lock:
                self._send(worker, ERROR, self.out[worker], e.ranks)

    def _serve_final(self, worker: int) -> None:
        with self.lock:
            if self.error is not None:
                self._send(worker, ERROR, None, self.error.ranks)
                return
            if worker not in self.final:
                self.final.add(worker)
                self.heard = time.monotonic()
            if len(self.final) == self.n:
                self._send(worker, DONE, self.out[worker])
                self.done.add(worker)
            else:
                behind = [w for w in range(self.n) if w not in self.final]
                self._send(worker, WAIT, None, holding_up(behind, list(self.pending)))
            self.lock.notify_all()


def _kinds(params: Sequence[torch.Tensor]) -> list[tuple[torch.dtype, list[torch.Tensor]]]:
    """The trained parameters by dtype (one flat message per dtype), in first-seen order."""
    kinds: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        kinds.setdefault(p.dtype, []).append(p)
    return list(kinds.items())


def _ranks(answer: torch.Tensor) -> list[int]:
    n = int(answer[2].item())
    return [int(v) for v in answer[3 : 3 + n].tolist()]


def _lost(
    rank: int, step: int, ranks: list[int], timeout_s: float, world: int, cause=None
) -> PeerLost:
    who = f"rank {ranks[0]}" if len(ranks) == 1 else (f"ranks {ranks}" if ranks else "a worker")
    why = f" ({type(cause).__name__})" if cause is not None else ""
    return PeerLost(
        f"rank {rank} waited on the parameter server at step {step}: {who} sent nothing within "
        f"timeout_s={timeout_s:g}{why} (died or stopped); rerun with --resume, or raise --timeout",
        step=step,
        group=list(range(world)),
        ranks=ranks,
    )
