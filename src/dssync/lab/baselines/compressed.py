"""Compressed BSP: DDP with one of PyTorch's gradient-compression communication hooks.

Both classes are :class:`~dssync.lab.baselines.bsp.BSP` with another hook in place of the plain
all-reduce, so the sync time is measured the same way (from the hook's call to its future's end,
merged over buckets; it overlaps backward). The hooks are PyTorch's own, used as they are:

* :class:`FP16`: ``default_hooks.fp16_compress_hook``: each bucket cast to float16, all-reduced,
  cast back (half the bytes; about three significant digits kept).
* :class:`PowerSGD`: ``powerSGD_hook.powerSGD_hook``: each gradient matrix replaced by a rank-r
  product P Q^T found by one power iteration, warm-started from the last step's Q, with error
  feedback (what compression dropped is added to the next step's gradient). Vectors (biases) and
  matrices that would not shrink by half are all-reduced uncompressed. The first
  ``start_iter`` steps are plain all-reduce, as PowerSGD's authors advise for warm-up.

Every rank applies the same all-reduced update, so parameters stay identical, as with DDP.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from dssync.errors import UsageError
from dssync.lab.baselines.bsp import BSP


class FP16(BSP):
    """DDP whose buckets travel as float16 (PyTorch's ``fp16_compress_hook``).

    Example::

        strategy = FP16(model)
        loss_fn(strategy.model(x), y).backward()   # gradients averaged in half precision
        optimizer.step()
    """

    name = "fp16"

    def _communicate(self, bucket: dist.GradBucket) -> torch.futures.Future:
        return default_hooks.fp16_compress_hook(self.process_group, bucket)


class PowerSGD(BSP):
    """DDP with PyTorch's PowerSGD hook: rank-``rank`` gradients, warm start, error feedback.

    Args:
        module: the model (on its device).
        rank: the rank of the low-rank approximation (the PowerSGD paper uses 1 to 4).
        start_iter: steps of plain all-reduce before compression starts (at least 2, as the
            hook needs for error feedback and warm start; PyTorch's default of 1000 suits long
            runs, 10 short ones).
        seed: seeds the hook's first random Q (the same on every rank).

    Example::

        strategy = PowerSGD(model, rank=2, start_iter=10)
        loss_fn(strategy.model(x), y).backward()   # rank-2 compressed after step 10
        optimizer.step()
    """

    name = "powersgd"

    def __init__(
        self,
        module: nn.Module,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float = 25.0,
        rank: int = 2,
        start_iter: int = 10,
        seed: int = 0,
        **ddp_kwargs,
    ) -> None:
        if not isinstance(rank, int) or rank < 1:
            raise UsageError(f"PowerSGD rank={rank!r} must be an integer >= 1; 2 is a good start")
        if not isinstance(start_iter, int) or start_iter < 2:
            raise UsageError(
                f"PowerSGD start_iter={start_iter!r} must be an integer >= 2 (error feedback and "
                "warm start need two plain steps first); use 10 for short runs"
            )
        super().__init__(module, process_group, bucket_cap_mb, **ddp_kwargs)
        self.state = powerSGD_hook.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start_iter,
            use_error_feedback=True,
            warm_start=True,
            random_seed=seed,
        )

    def _communicate(self, bucket: dist.GradBucket) -> torch.futures.Future:
        return powerSGD_hook.powerSGD_hook(self.state, bucket)

    def state_dict(self) -> dict[str, Any]:
        """The hook's step count (a resumed run compresses from where it stopped; the error
        feedback and warm-start memories start again from zero and random)."""
        return {"iter": self.state.iter}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.iter = int(state["iter"])
