"""Wait-avoiding DS-Sync: pairs averaged by a serving thread, so no rank waits on a slow partner.

Synchronous DS-Sync hands a straggler's delay on: each step's partner waits for it, and through
the shuffled pairs every rank soon does. Here a pair's average never needs both training loops
at once:

* **Roles.** Even ranks are active, odd ranks passive (:class:`~dssync.schedules.Bipartite`
  matches them afresh every step, a pure function of (seed, step)). After its optimizer step an
  active sends its parameters to the passive of this step and waits for that passive's answer.
  A passive's answer comes from a thread of its own process, never from its training loop, so
  the active waits for the bytes, not for the passive's compute; and a slow active only asks less
  often. Actives never answer and passives never ask, so no wait can close a cycle.
* **What a passive serves.** Its ``served`` copy: its parameters as of its last step boundary,
  plus every average since. A request with the active's x_a answers the served copy s and sets
  ``s <- (s + x_a) / 2``; the active sets ``x_a <- (x_a + s) / 2``, the same bits. At its next
  step boundary the passive's loop adds what its copy gained, ``x <- x + (s - published)``, and
  publishes the result as the new served copy. Requests are served one at a time under a lock,
  so several actives asking the same passive between two of its steps average in turn.
* **Staleness.** An active averages with the passive's model as of the passive's last step (at
  most one of the passive's steps old); the passive takes the averages at its next step.
* **Consensus.** Each served request applies a 2-by-2 averaging matrix (doubly stochastic, all
  entries 1/2) to the pair (x_a, s); the passive's merge carries it onto x unchanged. So the
  mean over ranks moves by exactly the mean local update (up to float rounding), and the models
  follow a product of pair-averaging matrices over a connected (complete bipartite) graph, which
  contracts to the mean as synchronous shuffled pairs do (AD-PSGD's argument).
* **Bytes.** Point-to-point on a gloo group made once at construction (receives from any
  source, which nccl cannot), staged through host memory on GPUs; the training group carries
  only the start-up broadcast and the final global average, on the parameters' device.
* **Start-up.** Before a byte of parameter data moves, every rank agrees as DSSync's do
  (:func:`~dssync.comm.agreement.check_start`): the model's names, shapes and dtypes in order,
  the seed, ``average_buffers`` and the rest; a mismatch, or a model of mixed dtypes on one
  rank, raises the same ``UsageError`` on every rank within ``timeout_s``.
* **Waits.** An active's wait for its answer is bounded by ``timeout_s`` (PeerLost names the
  passive). The serving thread waits for requests up to ``max(timeout_s, IDLE_S)`` (a daemon, so
  a failed run never waits for it; its group is made with ``timeout_s``, that one wait is
  given the longer bound). At the end each active tells every passive it is done; a
  passive waits for all of them, naming the ones silent for ``timeout_s``.
* **Checkpoints.** :meth:`state_dict` merges what the served copy gained first, so the saved
  model holds every average taken; a resumed run is correct but, being asynchronous, not
  bit-identical to one never stopped.

Example (under torchrun or :func:`dssync.lab.launch.spawn`)::

    sync = AsyncDSSync(model, seed=0)
    for x, y in loader:
        loss_fn(model(x), y).backward()
        opt.step(); opt.zero_grad()
        sync.step()        # active: average with this step's passive; passive: merge
    sync.average_all()           # every rank ends with the global mean
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm.agreement import check_module, check_start
from dssync.comm.align import align_rest
from dssync.comm.exchange import broadcast_tensors
from dssync.comm.side import serving_process_group
from dssync.comm.transport import average_tensors
from dssync.comm.wait import DEFAULT_TIMEOUT_S, WaitFailed, wait_for
from dssync.errors import PeerLost, SyncError
from dssync.hashing import fingerprint
from dssync.schedules import Bipartite, group_of
from dssync.strategies.base import Strategy
from dssync.strategies.sharded import refuse_sharded

ASK, DONE = 1, 2  # request kinds
HEAD, DATA, ANSWER = 1, 2, 3  # message tags
IDLE_S = 3600.0  # longest the serving thread waits for a request


class AsyncDSSync(Strategy):
    """DS-Sync without waiting on partners: active/passive pairs, passives answer from a thread.

    Args:
        module: the model, on its device (every rank starts from rank 0's).
        process_group: the ranks (default: all).
        seed: seed of the pairing (:class:`~dssync.schedules.Bipartite`).
        average_buffers: also average floating buffers (batch-norm statistics).
        timeout_s: how long a wait lets a peer be silent before raising PeerLost.

    Example::

        sync = AsyncDSSync(model)
        sync.step()            # after each optimizer step
        sync.average_all()
    """

    name = "dssync-async"

    def __init__(
        self,
        module: nn.Module,
        process_group: dist.ProcessGroup | None = None,
        seed: int = 0,
        average_buffers: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(module, process_group)
        check_module(module)
        refuse_sharded(module, "AsyncDSSync")
        self.timeout_s = timeout_s
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
        self.schedule = Bipartite(seed)
        self.average_buffers = average_buffers
        self.average_frozen = True  # every parameter is averaged, frozen or not
        self.active = self.rank % 2 == 0
        self.steps = 0
        self._settled = False  # True from settle() until the next step
        tensors = list(module.parameters())
        if average_buffers:
            tensors += [b for b in module.buffers() if b.is_floating_point()]
        self.tensors = [t for t in tensors if t.numel()]
        self._refusal: str | None = None  # told to every rank by the start-up agreement
        dtypes = sorted({str(t.dtype) for t in self.tensors})
        if len(dtypes) != 1:
            self._refusal = (
                f"AsyncDSSync averages one flat buffer of one dtype, the model has "
                f"{' and '.join(dtypes) or 'no tensors'}; cast the model to one floating dtype "
                "(e.g. model.float()) or use DSSync"
            )
        # Every rank agrees on the model (names, shapes, dtypes), the seed and the settings
        # before a byte of parameter data moves: a mismatch raises the same UsageError on every
        # rank within timeout_s (not an abort in the broadcast, or a pairing that hangs).
        buffers = (repr(average_buffers), "pass the same average_buffers= on every rank")
        check_start(self, {"average_buffers (floating buffers averaged)": buffers})
        with torch.no_grad():
            broadcast_tensors(tensors, 0, process_group, timeout_s)
        numel = sum(t.numel() for t in self.tensors)
        pin = self.tensors[0].device.type == "cuda"
        dtype = self.tensors[0].dtype
        self._mine = torch.empty(numel, dtype=dtype, pin_memory=pin)
        self._theirs = torch.empty(numel, dtype=dtype, pin_memory=pin)
        shapes = [(tuple(t.shape), str(t.dtype)) for t in self.tensors]
        self.layout = fingerprint(f"async {seed} {shapes}")
        # made with timeout_s: a peer that never comes fails it within timeout_s; the serving
        # thread's wait for the next request is the one wait allowed IDLE_S (_Server._serve)
        self.serving_process_group = serving_process_group(self.ranks, timeout_s)
        self.server = None if self.active else _Server(self)

    @property
    def wire(self) -> dist.ProcessGroup:
        """Deprecated: :attr:`serving_process_group` (``wire`` names a format elsewhere)."""
        warnings.warn(
            "AsyncDSSync.wire is now AsyncDSSync.serving_process_group (wire= is a format)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.serving_process_group

    def current_group(self) -> list[int]:
        """This rank and its partner of the current step (for error messages)."""
        return group_of(self.schedule.partition(self.steps, self.world_size), self.rank)

    def _flat(self, out: torch.Tensor) -> torch.Tensor:
        """The averaged tensors, flat, copied into ``out`` (on the host)."""
        return out.copy_(torch.cat([t.detach().reshape(-1) for t in self.tensors]))

    def _add(self, delta: torch.Tensor, scale: float = 1.0) -> None:
        """``tensors += scale * delta`` (delta flat, on the host)."""
        offset = 0
        for t in self.tensors:
            n = t.numel()
            part = delta[offset : offset + n].view_as(t).to(t.device, non_blocking=True)
            t.data.add_(part, alpha=scale)
            offset += n

    def _set(self, flat: torch.Tensor) -> None:
        offset = 0
        for t in self.tensors:
            n = t.numel()
            t.data.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    @torch.no_grad()
    def step(self) -> None:
        with self.syncing():
            if self.server is not None:
                self.server.start()
                self.server.merge()
            else:
                self._ask()
            self.steps += 1
            self._settled = False

    def _ask(self) -> None:
        """Active: send the model to this step's passive, take the mean with its answer."""
        group = group_of(self.schedule.partition(self.steps, self.world_size), self.rank)
        if len(group) < 2:
            return
        peer = self.ranks[group[1]]
        self._flat(self._mine)
        head = torch.tensor([ASK, self.steps, self.layout], dtype=torch.int64)
        answer = torch.empty(1, dtype=torch.int64)
        works = [
            dist.isend(head, peer, group=self.serving_process_group, tag=HEAD),
            dist.isend(self._mine, peer, group=self.serving_process_group, tag=DATA),
            dist.irecv(answer, peer, group=self.serving_process_group, tag=ANSWER),
            dist.irecv(self._theirs, peer, group=self.serving_process_group, tag=ANSWER + 1),
        ]
        for w in works:
            self._wait(w, group[1])
        if answer.item() != self.layout:
            raise SyncError(
                f"rank {self.rank} and rank {group[1]} average different models or pairings "
                f"(layout {self.layout} against {answer.item()}); every rank must run "
                "dssync-async on the same model with the same seed",
                step=self.steps,
                group=group,
                ranks=[group[1]],
            )
        self._mine.add_(self._theirs).mul_(0.5)
        self._set(self._mine)

    def _wait(self, work, peer: int) -> None:
        try:
            wait_for(work, time.monotonic() + self.timeout_s, self.serving_process_group)
        except WaitFailed as e:
            raise PeerLost(
                f"rank {self.rank} got no answer from passive rank {peer} at step {self.steps} "
                f"within timeout_s={self.timeout_s:g} ({type(e).__name__}): it died or stopped; "
                "resume from the last checkpoint, or raise timeout_s",
                step=self.steps,
                group=sorted([self.rank, peer]),
                ranks=[peer],
            ) from e

    @torch.no_grad()
    def settle(self) -> None:
        """End the asynchronous phase: actives say they are done, passives take every average.

        Every rank calls it (average_all does); a later step starts a new phase.
        """
        with self.syncing():
            if self.world_size == 1 or self._settled:
                return
            self._settled = True
            if self.server is not None:
                self.server.start()
                self.server.finish()
                return
            head = torch.tensor([DONE, self.steps, self.layout], dtype=torch.int64)
            passives = range(1, self.world_size, 2)
            works = [
                (p, dist.isend(head, self.ranks[p], group=self.serving_process_group, tag=HEAD))
                for p in passives
            ]
            for p, w in works:
                self._wait(w, p)

    @torch.no_grad()
    def average_all(self) -> None:
        """:meth:`settle`, then one global mean: every rank ends with the same model."""
        self.settle()
        with self.syncing():
            if self.world_size > 1:
                average_tensors(
                    self.tensors, self.process_group, self.world_size, timeout_s=self.timeout_s
                )
                align_rest(self.module, self.tensors, self.process_group, self.timeout_s)

    def state_dict(self) -> dict[str, Any]:
        if self.server is not None:
            with torch.no_grad():
                self.server.merge()
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        if self.server is not None:
            self.server.publish()


class _Server:
    """A passive rank's served copy and the thread that answers actives from it."""

    def __init__(self, sync: AsyncDSSync) -> None:
        self.sync = sync
        self.lock = threading.Lock()
        numel = sync._mine.numel()
        self.served = torch.empty(numel, dtype=sync._mine.dtype)
        self.published = torch.empty_like(self.served)
        self.taken = 0  # averages taken into the served copy since it was last published
        self.actives = len(range(0, sync.world_size, 2))
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.publish()

    def publish(self) -> None:
        with self.lock:
            self.taken = 0
            self.sync._flat(self.published)
            self.served.copy_(self.published)

    def merge(self) -> None:
        """At a step boundary: add what the served copy gained, then publish the new model."""
        if self.error is not None:
            raise self.error
        with self.lock:
            if self.taken:  # else the served copy is the published one: nothing to add
                self.sync._add(self.served.sub_(self.published))
                self.taken = 0
            self.sync._flat(self.published)
            self.served.copy_(self.published)

    def start(self) -> None:
        if self.thread is None:
            self.done: set[int] = set()
            self.heard = time.monotonic()
            self.thread = threading.Thread(target=self._serve, name="dssync-async", daemon=True)
            self.thread.start()

    def finish(self) -> None:
        """Wait until every active is done (naming the silent ones), then take the last averages."""
        while self.thread.is_alive():
            self.thread.join(timeout=0.2)
            if self.thread.is_alive() and time.monotonic() - self.heard > self.sync.timeout_s:
                silent = [a for a in range(0, self.sync.world_size, 2) if a not in self.done]
                raise PeerLost(
                    f"rank {self.sync.rank} waited at the end for active ranks {silent}: nothing "
                    f"came within timeout_s={self.sync.timeout_s:g} (died or stopped); resume "
                    "from the last checkpoint, or raise timeout_s",
                    step=self.sync.steps,
                    group=list(range(self.sync.world_size)),
                    ranks=silent,
                )
        self.thread = None
        self.merge()

    def _serve(self) -> None:
        sync = self.sync
        if sync.tensors[0].device.type == "cuda":
            torch.cuda.set_device(sync.tensors[0].device)
        head = torch.empty(3, dtype=torch.int64)
        incoming = torch.empty_like(self.served)
        answer = torch.empty_like(self.served)
        try:
            while len(self.done) < self.actives:
                asked = dist.irecv(head, src=None, group=sync.serving_process_group, tag=HEAD)
                wait_for(
                    asked,
                    time.monotonic() + max(sync.timeout_s, IDLE_S),
                    sync.serving_process_group,
                )
                active = asked._source_rank()  # a rank of the serving group: the sync's rank
                src = sync.ranks[active]
                self.heard = time.monotonic()
                if head[0].item() == DONE:
                    self.done.add(active)
                    continue
                got = dist.irecv(incoming, src, group=sync.serving_process_group, tag=DATA)
                wait_for(got, time.monotonic() + sync.timeout_s, sync.serving_process_group)
                with self.lock:
                    answer.copy_(self.served)
                    if head[2].item() == sync.layout:  # else the active raises SyncError
                        self.served.add_(incoming).mul_(0.5)
                        self.taken += 1
                layout = torch.tensor([sync.layout], dtype=torch.int64)
                works = [
                    dist.isend(layout, src, group=sync.serving_process_group, tag=ANSWER),
                    dist.isend(answer, src, group=sync.serving_process_group, tag=ANSWER + 1),
                ]
                deadline = time.monotonic() + sync.timeout_s
                for w in works:
                    wait_for(w, deadline, sync.serving_process_group)
        except Exception as e:  # noqa: BLE001 - the training loop raises it at its next step
            self.error = PeerLost(
                f"rank {sync.rank}'s serving thread lost an active rank ({type(e).__name__}: "
                f"{e}); resume from the last checkpoint, or raise timeout_s",
                step=sync.steps,
                group=list(range(sync.world_size)),
                ranks=[],
            )
