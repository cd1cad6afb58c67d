"""An outer optimizer applied at each averaging (``DSSync(outer=...)``): DiLoCo inside the groups.

Each rank keeps an anchor ``a_i``: its parameters just after the last averaging. Between
averagings the rank trains locally (``every`` inner steps). At an averaging the group averages
the parameters as usual, giving ``x̄_g``; then the pseudo-gradient ``Δ_i = a_i - x̄_g`` is handed
to the outer optimizer as the anchor's gradient, the outer optimizer steps the anchor, and the
parameters restart from it: ``x_i <- a_i``. The bytes moved are DS-Sync's own (the parameters,
once); nothing else crosses the network.

* With ``Global()`` every anchor is the same, and the mean of the workers' pseudo-gradients
  ``a - x_i`` is ``a - x̄``: this is DiLoCo (Douillard et al., arXiv 2311.08105) exactly.
* Outer SGD with ``lr=1`` and no momentum gives ``a_i <- x̄_g``: plain DS-Sync with local steps.
* With groups that change at every averaging (``Shuffle``), each rank's outer momentum holds the
  decayed sum of *its own* pseudo-gradients, each measured against whichever group it averaged
  with then; it is not shared with the partner of the moment. The global mean is still kept: a
  group's average is doubly stochastic, so the pseudo-gradients' mean over all ranks is
  ``mean(a) - mean(x)``, and for an outer optimizer that is linear in its gradients (SGD, with
  momentum or Nesterov) the per-rank momentum buffers and steps sum linearly, so the mean
  anchor follows DiLoCo applied to the global mean exactly. Partners disagree on their anchors
  afterwards (each keeps ``a_i - lr * (...)``, not the group mean), so consensus is reached
  more slowly than with plain averaging; with no gradient steps the disagreement still
  contracts for the default rate and momentum. For Adam (not linear: per-rank second moments
  divide each rank's step differently) the mean is not kept exactly.

With ``overlap=True`` the mean of what an averaging sent arrives at the next one, so the outer
step is applied one averaging late. At averaging ``t`` the rank sends its parameters ``s_i``
(kept as :attr:`Outer.sent` when the mean lands later than it is sent, whatever defers it) and trains on from them; at ``t + 1`` the group's mean ``m`` of the
``s`` arrives, the pseudo-gradient is ``a_i - m``, the outer optimizer steps the anchor, and the
parameters restart from it with the local progress made since sending:
``x_i <- a_i + (x_i - s_i)``, which is then sent. Each pseudo-gradient is still minus the group's
mean progress over one window of ``every`` steps, as in DiLoCo, taken one window late; outer SGD
at rate 1 without momentum gives overlap's own merge ``x_i <- m + (x_i - s_i)``, and the mean over
ranks is kept as above. The cost is the staleness: each window's progress reaches the anchors
one window later, so the outer momentum acts on pseudo-gradients one window old.

:class:`Outer` is a :class:`~dssync.strategies.hooks.Hook`: it acts at the points every
averaging has (:meth:`Outer.on_send`, :meth:`Outer.before_merge`, :meth:`Outer.after_merge`), and
whether the mean lands at once or one averaging late is the one thing it reads of the averaging.

Checkpoints: :meth:`Outer.state_dict` holds the anchors, the outer optimizer's state and, with
overlap, what was last sent.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from dssync.strategies.hooks import Averaging, Hook

OuterFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]


@dataclass(frozen=True)
class Nesterov:
    """A picklable factory of DiLoCo's outer optimizer (made by :func:`nesterov`)."""

    lr: float = 0.7
    momentum: float = 0.9

    def __call__(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        nesterov = self.momentum > 0
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, nesterov=nesterov)


def nesterov(lr: float = 0.7, momentum: float = 0.9) -> OuterFactory:
    """DiLoCo's outer optimizer: SGD with Nesterov momentum (lr 0.7, momentum 0.9 by default).

    ``nesterov(lr=1.0, momentum=0.0)`` is plain SGD at rate 1: plain DS-Sync with local steps.
    The factory pickles (spawned workers, Lightning's strategies may carry it).

    Example::

        sync = DSSync(model, schedule=Global(), every=500, outer=nesterov())
    """
    return Nesterov(lr, momentum)


class Outer(Hook):
    """Anchors and the outer optimizer of one DSSync (see the module docstring): a
    :class:`~dssync.strategies.hooks.Hook`.

    Example (what ``DSSync(outer=nesterov())`` does at an averaging)::

        >>> import torch
        >>> from dssync.strategies.hooks import Averaging
        >>> x = torch.zeros(2)
        >>> outer = Outer([x], nesterov(lr=1.0, momentum=0.0))
        >>> outer.on_start(None)          # anchors <- parameters (start-up, average_all)
        >>> x += 1.0                      # local steps, then the group's mean lands in x
        >>> outer.on_send(Averaging(None, 0, [0, 1]))
        >>> outer.after_merge(None)       # a <- outer step on a - x; x <- a
        >>> x
        tensor([1., 1.])
    """

    name = "outer"

    def __init__(self, params: Iterable[torch.Tensor], factory: OuterFactory) -> None:
        self.params = list(params)
        self.anchors = [p.detach().clone() for p in self.params]
        self.sent: list[torch.Tensor] | None = None  # deferred: what the last average sent
        self._due = False  # an outer step is due when the mean lands
        self.optimizer = factory(self.anchors)
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            from dssync.errors import UsageError

            raise UsageError(
                f"outer= must be a factory params -> torch.optim.Optimizer; it returned "
                f"{type(self.optimizer).__name__}; try outer=dssync.nesterov()"
            )

    def describe(self) -> str:
        """The optimizer's type and settings (what every rank must agree on)."""
        opt = self.optimizer
        groups = [{k: v for k, v in sorted(g.items()) if k != "params"} for g in opt.param_groups]
        return f"{type(opt).__name__}{groups}"

    @torch.no_grad()
    def on_start(self, host: object) -> None:
        """Anchors <- the parameters as they are now (the outer optimizer's state is kept);
        nothing sent is pending."""
        for a, p in zip(self.anchors, self.params, strict=True):
            a.copy_(p)
        self.sent, self._due = None, False

    @torch.no_grad()
    def on_send(self, ctx: Averaging) -> None:
        """An outer step is due when this averaging's mean lands; if it lands later than it is
        sent, the parameters as sent are kept (:attr:`sent`) until then."""
        self.sent = [p.detach().clone() for p in self.params] if ctx.deferred else None
        self._due = True

    @torch.no_grad()
    def before_merge(self, host: object) -> None:
        """A mean sent earlier is about to land: :attr:`sent` <- the progress made since
        sending, ``x - s``."""
        if self._due and self.sent is not None:
            for s, p in zip(self.sent, self.params, strict=True):
                s.neg_().add_(p)

    @torch.no_grad()
    def after_merge(self, host: object) -> None:
        """The mean ``m`` landed (``x = m + d``, ``d`` the progress :meth:`before_merge` kept,
        0 when it landed at once): pseudo-gradient ``a - m``, one outer step, ``x <- a + d``."""
        if not self._due:
            return
        progress = self.sent
        for i, (a, p) in enumerate(zip(self.anchors, self.params, strict=True)):
            a.grad = a - p if progress is None else a - (p - progress[i])
        self.optimizer.step()
        for i, (a, p) in enumerate(zip(self.anchors, self.params, strict=True)):
            p.copy_(a)
            if progress is not None:
                p.add_(progress[i])
            a.grad = None
        self.sent, self._due = None, False

    def state_dict(self) -> dict[str, Any]:
        state = {
            "anchors": [a.clone() for a in self.anchors],
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
        }
        if self.sent is not None:
            state["sent"] = [s.clone() for s in self.sent]
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any], host: object = None) -> None:
        for a, saved in zip(self.anchors, state["anchors"], strict=True):
            a.copy_(saved)
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        sent = state.get("sent")
        self.sent = None if sent is None else [s.clone() for s in sent]
        self._due = self.sent is not None  # saved between averagings: due only when deferred
