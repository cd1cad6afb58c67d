"""D-PSGD: every step each rank averages its parameters with its two ring neighbours.

The exchange is point-to-point on the one training group (``dist.batch_isend_irecv``: each
rank sends its flat buckets to both neighbours and receives theirs), so no group is created; the
buffers are the parameters' own flat buckets, on their device. The ring is
:func:`dssync.schedules.gossip.ring_peers`; one step applies :func:`ring_matrix` to the ranks'
parameters. (The one-peer exponential graph, ``exp-gossip``, needs no class of its own: it is a
schedule, :class:`~dssync.schedules.gossip.ExpGossip`, run by :class:`DSSync`.)
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm import DEFAULT_BUCKET_BYTES, FlatBuckets
from dssync.comm.align import align_rest
from dssync.comm.averager import Router
from dssync.comm.exchange import broadcast_tensors, swap_ops, wait
from dssync.comm.tags import ALL, STEP, Tag
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.lab.baselines.protocol import LabStrategy
from dssync.schedules.gossip import ring_peers


class DPSGD(LabStrategy):
    """Decentralized parallel SGD on a ring: x_i <- (x_{i-1} + x_i + x_{i+1}) / 3 after each step.

    Args:
        module: the model, on its device (its tensors are re-laid into flat buckets).
        process_group: the ranks of the ring (default: all).
        average_buffers: also mix floating buffers (batch-norm statistics).
        bucket_bytes: the largest flat buffer one message carries.
        timeout_s: how long to wait for the neighbours' buckets before raising PeerLost.

    Example (under ``torchrun`` or :func:`dssync.lab.launch.spawn`, 3 or more ranks)::

        strategy = DPSGD(model)
        loss_fn(model(x), y).backward()
        optimizer.step()
        strategy.step()        # mix with both ring neighbours
        strategy.average_all()       # one global average for the final model
    """

    name = "dpsgd"

    def __init__(
        self,
        module: nn.Module,
        process_group: dist.ProcessGroup | None = None,
        average_buffers: bool = True,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(module, process_group)
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.peers = ring_peers(self.rank, self.world_size)
        self.timeout = timedelta(seconds=timeout_s)
        self.steps = 0
        tensors = list(module.parameters())
        if average_buffers:
            tensors += [b for b in module.buffers() if b.is_floating_point()]
        self._buckets = FlatBuckets(tensors, bucket_bytes)
        self._inbox = [[torch.empty_like(b) for b in self._buckets.buffers] for _ in self.peers]
        self.timeout_s = timeout_s
        self.router = Router(process_group, None, timeout_s, bucket_bytes)
        with torch.no_grad():
            broadcast_tensors(self._buckets.buffers, 0, process_group, timeout_s, self.router.roll)

    def _global(self, rank: int) -> int:
        if self.process_group is None:
            return rank
        return dist.get_global_rank(self.process_group, rank)

    def current_group(self) -> list[int]:
        """This rank and the neighbours it mixes with."""
        return sorted([self.rank, *self.peers])

    @torch.no_grad()
    def step(self) -> None:
        """Send the buckets to both neighbours, receive theirs, keep the mean of the three."""
        with self.syncing():
            if self.peers:
                self._exchange()
            self.steps += 1

    def _exchange(self) -> None:
        """Swap every bucket with both neighbours in one batch (receives first), each wait the
        one bounded wait (:func:`dssync.comm.exchange.wait`) naming the neighbour it waits on."""
        ops, named = [], []
        for peer, inbox in zip(self.peers, self._inbox, strict=True):
            dst = self._global(peer)
            for tag, (buf, recv) in enumerate(zip(self._buckets.buffers, inbox, strict=True)):
                ops += swap_ops(recv, buf, dst, self.process_group, tag)
                named += [peer, peer]
        timeout_s = self.timeout.total_seconds()
        deadline = time.monotonic() + timeout_s
        tag = Tag(STEP, self.steps, self._buckets.layout())
        what = f"rank {self.rank} got no parameters from its ring neighbours {self.peers}"
        works = dist.batch_isend_irecv(ops)
        if len(works) != len(ops):  # a backend that coalesces the batch: both neighbours
            named = [sorted(set(self.peers))] * len(works)
        else:
            named = [[p] for p in named]
        for work, peers in zip(works, named, strict=True):
            wait(
                work,
                deadline,
                tag,
                self.current_group(),
                timeout_s,
                peers,
                what=what,
                process_group=self.process_group,
            )
        share = 1.0 / (1 + len(self.peers))
        for i, buf in enumerate(self._buckets.buffers):
            for inbox in self._inbox:
                buf.add_(inbox[i])
            buf.mul_(share)

    @torch.no_grad()
    def average_all(self) -> None:
        """One global average over all ranks (the final model)."""
        with self.syncing():
            if self.world_size > 1:
                everyone = list(range(self.world_size))
                self.router.average(everyone, ALL, self.steps, buffers=self._buckets.buffers)
                align_rest(self.module, self._buckets.tensors, self.process_group, self.timeout_s)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
