"""Averaging at the optimizer's step (``DSSync(average_grads=True)``): what Adam needs averaged.

Plain DS-Sync lets each rank step on its own gradient, then averages the parameters. With SGD
that is the same as averaging the gradients first. With Adam (any optimizer that divides by a
running second moment) it is not: rank ``i``'s second moment ``v_i`` is built from its own
gradient, whose square holds the per-rank batch noise (``E[g_i^2] = E[g]^2 + Var[g_i]``), so
every rank's step is smaller than the step on the group's mean gradient would be, and averaging
the moments keeps the noise (it averages ``g_i^2``, not ``mean(g)^2``).

With ``average_grads=True`` the averaging moves from after the optimizer's step to just before
it, hooked on the optimizer's step (``register_step_pre_hook``, as torchft hooks its inner
optimizer): the group averages its parameters and its gradients in ONE message, then every
member steps from the same point with the same gradient. Averaging every step, each rank keeps
its own moments, fed the group's mean gradients (and the second moment corrected, below): on
the ``lm`` workload at four ranks that came within 0.02% of DDP's validation loss, against
0.30% with the moments averaged too, at half the bytes (2x the parameters' bytes instead of 4x;
docs/guide/adam.md). With local steps (``every`` > 1) or an outer step the optimizer state
travels as well. In a group of two ranks that is DDP's step exactly (every rank's moments were
fed the same gradients); in pairs that change (Shuffle(2) on more ranks) each step's second
moment sees the pair's mean gradient.

A rank that steps without calling ``optimizer.step()`` (a rank out of data under ``Join``, which
serves its groups) sends zeros for its gradients, as a joined DDP rank does.
"""

from __future__ import annotations

from typing import Any

import torch

from dssync.strategies.hooks import Averaging, Hook, Host

# Optimizers that divide by a running average of squared gradients.
ADAPTIVE = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adamax,
    torch.optim.Adagrad,
    torch.optim.RMSprop,
    torch.optim.Adadelta,
)


def is_adaptive(optimizer: torch.optim.Optimizer | None) -> bool:
    """True for the Adam family (an optimizer normalizing by a second moment)."""
    return isinstance(optimizer, ADAPTIVE)


class BeforeStep(Hook):
    """Runs a DSSync's averaging inside ``optimizer.step()``, before it steps, with the gradients:
    a :class:`~dssync.strategies.hooks.Hook`.

    The optimizer's step pre-hook calls ``host.average_now()``
    (:meth:`~dssync.strategies.DSSync.average_now`); the gradients travel with that averaging
    (:meth:`travels`) and Adam's second moment is corrected once the mean landed
    (:meth:`after_merge`). The :meth:`~dssync.strategies.DSSync.step` after the optimizer's step
    then only counts.

    Example::

        sync = DSSync(model, optimizer=opt, average_grads=True)
        loss.backward(); opt.step()     # averages here, before Adam's step
        sync.step()                     # counts the step
    """

    def __init__(
        self,
        host: Host,
        optimizer: torch.optim.Optimizer,
        params: list[torch.nn.Parameter] | None = None,
        correct_v: bool = True,
    ) -> None:
        self.host = host
        self.optimizer = optimizer
        self.correct_v = correct_v
        self._bound_each_input = False  # the correction's bound before (measurement only)
        self._floor = True  # the running average at least k/W of plain (False: measurement only)
        # in the module's order (matched by name, as the optimizer state is), not the optimizer's
        held = (
            params
            if params is not None
            else [p for g in optimizer.param_groups for p in g["params"]]
        )
        self.params = [p for p in held if p.requires_grad]
        self._in_step = False  # averaging inside optimizer.step(): this rank's gradients travel
        self._own: dict[torch.Tensor, torch.Tensor] = {}  # ... as they were before the average
        self._size = 0  # ... in a group of this many
        self.handle = optimizer.register_step_pre_hook(self._before_step)

    def travels(self) -> list[torch.Tensor]:
        """The gradients that travel with the averaging: zeros on a rank that did not step (it
        ran out of data, under ``Join``), as a joined DDP rank sends."""
        if not self._in_step:
            return [torch.zeros_like(p) for p in self.params]
        for p in self.params:
            if p.grad is None:  # a parameter this step did not reach: its mean gradient counts it 0
                p.grad = torch.zeros_like(p)
        return [p.grad for p in self.params]

    def on_send(self, ctx: Averaging) -> None:
        """Keep this rank's own gradients, the second moment's correction needs them."""
        correcting = self._in_step and self.correct_v
        self._own = {p: p.grad.clone() for p in self.params if p.grad is not None and correcting}
        self._size = len(ctx.group)

    @torch.no_grad()
    def after_merge(self, host: Host) -> None:
        """The group's mean gradient landed: correct Adam's second moment for it."""
        own, self._own = self._own, {}
        if self._in_step and self.correct_v and self._size > 1:
            self._correct(own, self._size)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if (self.host.steps + 1) % self.host.every:
            return None
        closure = kwargs.get(
            "closure", args[1] if len(args) > 1 else None
        )  # args[0]: the optimizer
        if closure is None:
            self._average_here()
            return None

        def averaged() -> Any:  # step(closure): backward runs inside, so average after it
            loss = closure()
            self._average_here()
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": averaged}
        return (args[0], averaged, *args[2:]), kwargs

    @torch.no_grad()
    def _average_here(self) -> None:
        self._in_step = True
        try:
            self.host.average_now()
        finally:
            self._in_step = False

    def _correct(self, own: dict[torch.Tensor, torch.Tensor], size: int) -> None:
        """Make the second moment's input E[g_world^2] rather than E[g_group^2]: take
        (1/k - 1/W) of the per-rank variance, estimated from this rank's distance to the mean,
        off the squared mean gradient, through ``exp_avg_sq`` before Adam's update.

        The estimate of one step is noisy (in a pair, one degree of freedom), so it is not
        bounded step by step: a bound on each input (at least ``g^2 * k / W``) kept 82% of the
        excess where the noise dominates, not 50% (measured on ``lm`` at 4 ranks: +2.2% against
        DDP; docs/guide/adam.md). The running average is bounded instead: never below ``k / W``
        of what it would be fed the group's squared mean (what it estimates, mean^2 + var / W,
        is at least that), nor below what this step's own input adds to it."""
        world = self.host.world_size
        if size >= world:
            return
        k = size
        for g in self.optimizer.param_groups:
            b2 = g["betas"][1]
            for p in g["params"]:
                st = self.optimizer.state.get(p, {})
                mine = own.get(p)
                if mine is None or "exp_avg_sq" not in st:
                    continue
                v, sq = st["exp_avg_sq"], p.grad * p.grad
                var = (mine - p.grad).square_().mul_(k / (k - 1))
                if self._bound_each_input:  # the bound before (a measurement, tools/lm_parity.py)
                    fed = torch.maximum(sq - var * (1 / k - 1 / world), sq * (k / world))
                    v.sub_((sq - fed).mul_((1 - b2) / b2))
                    continue
                plain = v * b2 + sq * (1 - b2)  # Adam's next second moment, uncorrected
                floor = k / world if self._floor else 0.0
                nxt = torch.maximum(plain - var * ((1 - b2) * (1 / k - 1 / world)), plain * floor)
                v.copy_(nxt.sub_(sq * (1 - b2)).div_(b2).clamp_(min=0))

    def close(self) -> None:
        self.handle.remove()
