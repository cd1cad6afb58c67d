"""The end of a global average: every rank holds the same model, buffers and all.

A strategy's ``average_all`` averages what it trains and averages along the way (floating
parameters, floating buffers, sometimes the optimizer's state). What it does not average still
differs between ranks: integer and bool buffers count or flag something for one rank and have no
mean (BatchNorm's ``num_batches_tracked`` after uneven data under ``Join``: 345 on one rank, 270
on the other), and so do floating buffers a strategy leaves alone (``average_buffers=False``,
DDP's buffers after the last forward) and frozen parameters. :func:`align_rest` gives every rank
rank 0's copy of those, as the start does (``broadcast_init``, DDP's broadcast of the module's
state), so after ``average_all()`` a hash of the whole ``state_dict`` is the same on every rank.

One broadcast per dtype, on the training group (they are model tensors, on its device), bounded
by ``timeout_s`` like every collective of dssync's.

Example::

    sync.average_all()         # inside it: the average, then
    align_rest(module, averaged_tensors, process_group, timeout_s)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from dssync.comm.exchange import broadcast_tensors
from dssync.comm.wait import DEFAULT_TIMEOUT_S


def align_rest(
    module: nn.Module,
    averaged: Iterable[torch.Tensor],
    process_group: dist.ProcessGroup | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Every parameter and buffer of ``module`` not in ``averaged`` takes group rank 0's value.

    Collective over ``process_group`` (all its ranks call it alike, after the global average).
    """
    if dist.get_world_size(process_group) < 2:
        return
    done = {id(t) for t in averaged}
    rest = [t for t in (*module.parameters(), *module.buffers()) if id(t) not in done]
    rest = [t.to_local() if isinstance(t, DTensor) else t for t in rest]  # a shard: its piece
    if rest:
        with torch.no_grad():
            broadcast_tensors(rest, 0, process_group, timeout_s)
