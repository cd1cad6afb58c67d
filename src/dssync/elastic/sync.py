"""ElasticDSSync: DS-Sync over the replicas that are alive, with torchft's quorum and healing.

At each averaging the replica asks torchft for the quorum (the live replicas, from the
Lighthouse), partitions the quorum's replicas with the schedule (a pure function of the
averaging, the member count and the seed: every member computes the same groups), averages with
its group point to point over torchft's reconfigured process group, and commits through
torchft's two-phase ``should_commit``. A member lost before or during an averaging costs its
group that averaging only; the next quorum leaves it out. A replica that joins (or comes back)
is behind torchft's step count, so torchft heals it from a live peer: the model, the optimizer
state and this class's own state travel through torchft's checkpoint transport, and it averages
from that averaging on.

Why a class of its own and not ``DSSync(..., manager=)``: DSSync's core (the Router, start-up
agreement, groups made at construction, overlap's lane, torch ``Join``) is built on one
torch.distributed group whose ranks never change; here the members and their ranks change with
each quorum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from dssync.elastic.group import average_in_group, flatten, unflatten
from dssync.elastic.quorum import ReplicaManager
from dssync.errors import SyncError, UsageError
from dssync.schedules import Schedule, Shuffle, group_of
from dssync.strategies.base import Strategy

STEP, ALL = 1, 2  # header kinds: a scheduled averaging, a global one

# What DSSync offers and this class does not (yet), each with why. A value other than the
# default is refused at construction.
REFUSED: dict[str, tuple[Any, str]] = {
    "overlap": (
        False,
        "an overlapped average in flight when a member is lost or a quorum changes has no "
        "defined merge yet",
    ),
    "topology": (
        None,
        "the topology-aware plan is made once for fixed hosts; re-planning it over each "
        "quorum's hosts is not built",
    ),
    "replan": (0, "re-planning needs the topology-aware plan (see topology)"),
    "outer": (
        None,
        "outer anchors would have to be healed and re-anchored on every membership change; "
        "not built",
    ),
    "wire": (
        "fp32",
        "compressed wires keep per-partner residuals whose sum a lost member takes with it",
    ),
    "fragments": (1, "fragments rotate with the partition and are not healed; not built"),
    "average_grads": (None, "averaging inside optimizer.step() needs DSSync's BeforeStep"),
}


@dataclass
class Averaging:
    """What one averaging did, for logs and tests."""

    averaging: int  # torchft's committed step count when it started
    members: list[int]  # the quorum's replica numbers
    group: list[int]  # this replica's group, replica numbers
    outcome: str  # "averaged", "alone", "lost" (a member was lost: own values kept), "skipped"
    healed: bool  # this replica received a live peer's state in this quorum
    seconds: float
    lost: dict[int, str] = field(default_factory=dict)  # replica number -> what happened


class ElasticDSSync(Strategy):
    """DS-Sync whose members are torchft's live replicas; one process per replica.

    Args:
        module: the model (on the CPU: the averaging runs on gloo).
        manager: a :class:`~dssync.elastic.ReplicaManager` (torchft's Manager with the process
            group whose quorum this class reads, and a synchronous quorum).
        optimizer: its state travels to a healed replica and its floating state (momentum,
            Adam's moments) is averaged with the parameters.
        schedule: which replicas average together; indices are the quorum's replicas in the
            order of their numbers (default ``Shuffle(2, uneven=True)``: pairs, one alone at an
            odd count); a quorum no larger than one group averages as one (of one: alone).
        every: average after every ``every``-th optimizer step.
        average_buffers: also average floating buffers (batch-norm statistics).

    DSSync's other options (``overlap``, ``topology``, ``replan``, ``outer``, ``wire``,
    ``fragments``, ``average_grads``) are refused with the reason (:data:`REFUSED`).

    Example (each replica a process; a Lighthouse at ``http://127.0.0.1:29510``)::

        from dssync.elastic import ElasticDSSync, ReplicaManager
        manager = ReplicaManager("replica_0", "http://127.0.0.1:29510", min_replicas=2)
        sync = ElasticDSSync(model, manager, optimizer=opt)
        for x, y in batches:
            loss_fn(model(x), y).backward()
            opt.step(); opt.zero_grad()
            sync.step()          # averages with this averaging's group of live replicas
        sync.average_all()
        sync.close()
    """

    name = "elastic-dssync"

    def __init__(
        self,
        module: nn.Module,
        manager: ReplicaManager,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        schedule: Schedule | None = None,
        every: int = 1,
        average_buffers: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(module)
        refuse(options)
        if not isinstance(manager, ReplicaManager):
            raise UsageError(
                f"manager={type(manager).__name__}: pass a dssync.elastic.ReplicaManager "
                "(torchft's Manager with the process group whose quorum ElasticDSSync reads, "
                "and a synchronous quorum)"
            )
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise UsageError(f"every={every!r} must be an integer >= 1")
        devices = {t.device.type for t in module.state_dict().values()}
        if devices - {"cpu"}:
            raise UsageError(
                f"the model is on {sorted(devices)}; ElasticDSSync averages on gloo over CPU "
                "tensors: keep the model on the CPU"
            )
        self.manager = manager
        self.replica = manager.replica
        self.optimizer = optimizer
        self.schedule = schedule if schedule is not None else Shuffle(2, seed=0, uneven=True)
        self.every = every
        self.average_buffers = average_buffers
        self.timeout_s = manager.timeout_s
        self.steps = 0
        self.history: list[Averaging] = []
        self._healed = False
        self._closed = False
        manager.register_state_dict_fn("dssync", self._load, self._save)

    @property
    def averagings(self) -> int:
        """Committed averagings: torchft's step count, which healing hands on."""
        return self.manager.current_step()

    @torch.no_grad()
    def step(self) -> None:
        """Count an optimizer step; every ``every``-th one, average with this averaging's group
        of live replicas."""
        self.steps += 1
        if self.steps % self.every == 0:
            self._average(STEP)

    @torch.no_grad()
    def average_all(self) -> None:
        """One average over every replica of the quorum (e.g. for the final model)."""
        self._average(ALL)

    def close(self) -> None:
        """Leave: stop torchft's manager (its servers); the others' next quorum goes on
        without this replica."""
        if not self._closed:
            self._closed = True
            self.manager.shutdown(wait=False)

    def _average(self, kind: int) -> None:
        started = time.monotonic()
        self._healed = False
        try:
            self.manager.start_quorum()
        except Exception as e:  # torchft raises what its quorum RPC raised
            raise SyncError(
                f"replica {self.replica}: no quorum of at least "
                f"min_replicas={self.manager.min_replicas} live replicas formed ({e}); start "
                "more replicas or lower min_replicas",
                step=self.averagings,
            ) from e
        t = self.averagings
        members = self.manager.pg.members
        if members is None or self.manager.errored() is not None:
            group, replicas, outcome, lost = [self.replica], [], "skipped", {}
            means = None
        else:
            if members.ranks[members.rank] != self.replica:
                raise SyncError(
                    f"replica {self.replica} has rank {members.rank} in quorum "
                    f"{members.quorum_id}, whose ranks are replicas {list(members.ranks)}: "
                    "torchft's ranks and replica numbers disagree (two replicas with one number?)",
                    step=t,
                )
            replicas = members.replicas
            if kind == ALL:
                group = replicas
            else:
                group = group_in_quorum(self.schedule, t, replicas, self.replica)
            means, outcome, lost = None, "alone", {}
            if len(group) > 1:
                header = {
                    "kind": kind,
                    "averaging": t,
                    "quorum": members.quorum_id,
                    "elements": sum(x.numel() for x in self._tensors()),
                }
                result = average_in_group(
                    self.manager.pg,
                    [members.rank_of(r) for r in group],
                    members.rank,
                    flatten(self._tensors()),
                    header,
                    self.timeout_s,
                )
                means = result.means
                lost = {members.ranks[r]: why for r, why in result.lost.items()}
                outcome = "lost" if lost else "averaged"
        if self.manager.should_commit() and means is not None:
            unflatten(means, self._tensors())
        self.history.append(
            Averaging(t, replicas, group, outcome, self._healed, time.monotonic() - started, lost)
        )

    def _tensors(self) -> list[torch.Tensor]:
        """What an averaging averages: parameters, floating buffers, the optimizer's floating
        state, in the module's order (the same on every replica)."""
        out = [p.data for p in self.module.parameters()]
        if self.average_buffers:
            out += [b for b in self.module.buffers() if b.is_floating_point()]
        if self.optimizer is not None:
            state = self.optimizer.state
            for p in self.module.parameters():
                for _, v in sorted(state.get(p, {}).items()):
                    if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0:
                        out.append(v)
        return out

    def _save(self) -> dict[str, Any]:
        """What a healed replica receives: copies, taken now (the transport serves them while
        this replica goes on averaging)."""
        state = {
            "model": self.module.state_dict(),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "steps": self.steps,
            "every": self.every,
            "schedule": self.schedule.describe(),
        }
        return tree_map(lambda v: v.detach().clone() if torch.is_tensor(v) else v, state)

    def _load(self, state: dict[str, Any]) -> None:
        mine = (self.schedule.describe(), self.every)
        if (state["schedule"], state["every"]) != mine:
            raise UsageError(
                f"replica {self.replica} runs schedule={mine[0]}, every={mine[1]}; the live "
                f"replicas run schedule={state['schedule']}, every={state['every']}: start it "
                "with the same schedule and every"
            )
        self.module.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self._healed = True


def group_in_quorum(
    schedule: Schedule, averaging: int, replicas: list[int], replica: int
) -> list[int]:
    """The replica numbers ``replica`` averages with at ``averaging``: its group in the
    schedule's partition of ``replicas`` (sorted), or all of them when the quorum holds no more
    replicas than one group (a quorum of one: alone).

    Example::

        >>> group_in_quorum(Shuffle(2, seed=0, uneven=True), 0, [4], 4)
        [4]
    """
    size = getattr(schedule, "group_size", None)
    if len(replicas) == 1 or (size is not None and len(replicas) <= size):
        return list(replicas)
    index = replicas.index(replica)
    return [replicas[i] for i in group_of(schedule.partition(averaging, len(replicas)), index)]


def refuse(options: dict[str, Any]) -> None:
    """Raise a UsageError naming each DSSync option given that ElasticDSSync does not support."""
    unknown = sorted(set(options) - set(REFUSED))
    if unknown:
        raise UsageError(
            f"ElasticDSSync got unknown arguments {unknown}; it takes module, manager, "
            "optimizer, schedule, every, average_buffers"
        )
    for name, value in options.items():
        default, why = REFUSED[name]
        if value != default:
            raise UsageError(
                f"{name}={value!r} is not supported elastically: {why}. Leave {name} at "
                f"{default!r}, or use DSSync on a fixed set of ranks"
            )
