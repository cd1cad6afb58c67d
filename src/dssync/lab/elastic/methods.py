"""What one elastic replica trains with: dssync's ElasticDSSync or torchft's own DiLoCo/LocalSGD.

Each is an :class:`ElasticTrainer`: the loop calls :meth:`~ElasticTrainer.step` after every
optimizer step and reads :attr:`~ElasticTrainer.steps` (handed on to a replica healed from a
live peer, so a restarted replica goes on where the others are). torchft's DiLoCo and LocalSGD
run unchanged: they hook the optimizer's step, take their quorum and all-reduce through the
same :class:`~dssync.elastic.ReplicaManager` (torchft's Manager on a reconfigurable gloo group)
that ElasticDSSync uses, so the race is on one launcher. What torchft does not heal for them
(the model, the inner optimizer, the step count) is registered here with the Manager's
``register_state_dict_fn``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dssync.errors import UsageError
from dssync.lab.config import TrainConfig

ELASTIC_DSSYNC = "elastic-dssync"
TORCHFT_DILOCO = "torchft-diloco"
TORCHFT_LOCAL_SGD = "torchft-local-sgd"
NAMES = (ELASTIC_DSSYNC, TORCHFT_DILOCO, TORCHFT_LOCAL_SGD)


class ElasticTrainer:
    """The interface the elastic loop drives; ``members`` are the replicas of the last quorum;
    ``outcome`` is what the last step's averaging did and ``healed`` whether it received a live
    peer's state (None when that step did not average or the method does not say)."""

    steps: int
    members: list[int] | None = None
    outcome: str | None = None
    healed: bool | None = None

    def step(self) -> None:
        raise NotImplementedError

    def average_all(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class DSSyncTrainer(ElasticTrainer):
    """dssync's :class:`~dssync.elastic.ElasticDSSync` (groups from the schedule over the quorum)."""

    def __init__(self, cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, manager):
        from dssync.elastic import REFUSED, ElasticDSSync
        from dssync.schedules import schedule_from_name

        # what ElasticDSSync refuses, passed on when set so that it names the reason
        refused = {
            k: getattr(cfg, k)
            for k in ("overlap", "wire", "fragments", "replan")
            if getattr(cfg, k) is not None and getattr(cfg, k) != REFUSED[k][0]
        }
        if cfg.outer not in (None, "none"):
            refused["outer"] = cfg.outer
        self.sync = ElasticDSSync(
            model,
            manager,
            optimizer=opt,
            schedule=schedule_from_name(
                cfg.schedule, cfg.group_size or 2, seed=cfg.seed, repeat=cfg.repeat, uneven=True
            ),
            every=cfg.every or 1,
            **refused,
        )
        self._averaged = False

    @property
    def steps(self) -> int:
        return self.sync.steps

    @property
    def members(self) -> list[int] | None:
        return self.sync.history[-1].members if self.sync.history else None

    @property
    def outcome(self) -> str | None:
        return self.sync.history[-1].outcome if self._averaged else None

    @property
    def healed(self) -> bool | None:
        return self.sync.history[-1].healed if self._averaged else None

    def step(self) -> None:
        before = len(self.sync.history)
        self.sync.step()
        self._averaged = len(self.sync.history) > before  # outcome and healed are this step's

    def average_all(self) -> None:
        self.sync.average_all()

    def close(self) -> None:
        self.sync.close()


class TorchftTrainer(ElasticTrainer):
    """torchft's own ``DiLoCo`` (outer SGD with Nesterov momentum 0.9 at ``cfg.outer_lr``) or
    ``LocalSGD``, every ``cfg.every`` steps, entered as the context managers they are."""

    def __init__(
        self, kind: str, cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, manager
    ):
        from torchft.local_sgd import DiLoCo, LocalSGD

        self.manager, self.model, self.opt = manager, model, opt
        self.steps = 0
        every = cfg.every or 4
        manager.register_state_dict_fn("lab", self._load, self._save)
        if kind == TORCHFT_DILOCO:
            outer = torch.optim.SGD(
                model.parameters(), lr=cfg.outer_lr, momentum=0.9, nesterov=True
            )
            self.method: Any = DiLoCo(manager, [model], opt, outer, sync_every=every)
        else:
            self.method = LocalSGD(manager, model, opt, sync_every=every)
        self.method.__enter__()
        self._closed = False

    @property
    def members(self) -> list[int] | None:
        m = self.manager.pg.members
        return None if m is None else m.replicas

    def step(self) -> None:  # torchft synchronized inside the optimizer's step (its hooks)
        self.steps += 1

    @torch.no_grad()
    def average_all(self) -> None:
        """One all-reduce of the parameters and floating buffers (batch norm's statistics, which
        torchft's methods leave apart) over the quorum, committed by torchft."""
        self.manager.start_quorum()
        tensors = [p.data for p in self.model.parameters()]
        tensors += [b for b in self.model.buffers() if b.is_floating_point()]
        means = [t.detach().clone() for t in tensors]
        works = [self.manager.allreduce(t) for t in means]
        for w in works:
            w.wait()
        if self.manager.should_commit():
            for t, mean in zip(tensors, means, strict=True):
                t.copy_(mean)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.method.__exit__(None, None, None)
            self.manager.shutdown(wait=False)

    def _save(self) -> dict[str, Any]:
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.opt.state_dict(),
            "steps": self.steps,
        }

    def _load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])


def build_trainer(
    cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, manager
) -> ElasticTrainer:
    """The trainer ``cfg.sync`` names (one of :data:`NAMES`)."""
    if cfg.sync == ELASTIC_DSSYNC:
        return DSSyncTrainer(cfg, model, opt, manager)
    if cfg.sync in (TORCHFT_DILOCO, TORCHFT_LOCAL_SGD):
        return TorchftTrainer(cfg.sync, cfg, model, opt, manager)
    raise UsageError(f"sync={cfg.sync!r} does not run elastically; use one of {', '.join(NAMES)}")
