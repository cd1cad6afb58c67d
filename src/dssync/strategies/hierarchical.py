"""Hierarchical all-reduce of gradients: reduce inside a domain, all-reduce among leaders, broadcast."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm import DEFAULT_BUCKET_BYTES, plan_buckets
from dssync.strategies.base import Strategy, SyncTimer
from dssync.topology import Topology


class Hierarchical(Strategy):
    """Gradients averaged in three stages over the topology's domains (racks, else hosts).

    1. reduce every bucket to the domain's leader (its lowest rank) inside the domain;
    2. all-reduce among the leaders, one per domain;
    3. broadcast the sum back inside each domain, and divide by the world size.

    Gradients are copied into flat buckets of at most ``bucket_bytes`` so each stage moves a few
    large buffers. Every rank ends with exactly the global mean gradient, as with DDP.

    Example (under torchrun or :func:`dssync.launch.spawn`)::

        topo = dssync.topology.detect()
        strategy = Hierarchical(model, topo)
        loss.backward(); strategy.after_backward(); optimizer.step()
    """

    name = "hierarchical"

    def __init__(self, module: nn.Module, topology: Topology | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, broadcast_init: bool = True) -> None:
        super().__init__(module)
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized; call dist.init_process_group() first")
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        if topology is None:
            from dssync.topology import detect

            topology = detect()
        if topology.world_size != self.world_size:
            raise ValueError(f"topology has {topology.world_size} ranks but the job has {self.world_size}; "
                             "detect it in this job (dssync.topology.detect())")
        self.topology = topology
        self.bucket_bytes = bucket_bytes
        domains = topology.domains()
        self.domain = next(d for d in domains if self.rank in d)
        self.leader = self.domain[0]
        self.leaders = [d[0] for d in domains]
        self._local = self._leader_pg = None
        for d in domains:  # every rank creates every group, in the same order
            pg = dist.new_group(d) if 1 < len(d) < self.world_size else None
            if self.rank in d:
                self._local = dist.group.WORLD if len(d) == self.world_size else pg
        pg = dist.new_group(self.leaders) if len(self.leaders) > 1 else None
        if self.rank in self.leaders:
            self._leader_pg = pg
        if broadcast_init:
            with torch.no_grad():
                for p in module.parameters():
                    dist.broadcast(p.data, src=0)

    @torch.no_grad()
    def after_backward(self) -> None:
        params = [p for p in self.module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        with SyncTimer(self):
            for bucket in plan_buckets([p.grad for p in params], self.bucket_bytes):
                flat = torch.cat([g.reshape(-1) for g in bucket])
                self.reduce(flat)
                flat.div_(self.world_size)
                offset = 0
                for g in bucket:
                    g.copy_(flat[offset : offset + g.numel()].view_as(g))
                    offset += g.numel()

    def reduce(self, flat: torch.Tensor) -> None:
        """Leave the sum over all ranks of ``flat`` in ``flat`` on every rank (all ranks call)."""
        if self._local is dist.group.WORLD:
            dist.all_reduce(flat)
            return
        if self._local is not None:
            dist.reduce(flat, dst=self.leader, group=self._local)
        if self._leader_pg is not None:
            dist.all_reduce(flat, group=self._leader_pg)
        if self._local is not None:
            dist.broadcast(flat, src=self.leader, group=self._local)

    def average_all(self) -> None:
        """Nothing to do: every rank applies the same mean gradient."""

    @classmethod
    def from_config(cls, cfg, module: nn.Module, opt: torch.optim.Optimizer) -> Hierarchical:
        """Builder for the ``STRATEGIES`` registry (``--sync hierarchical``)."""
        return cls(module, bucket_bytes=int(cfg.bucket_mb * 2**20))
