"""Hierarchical all-reduce of gradients: reduce inside a domain, all-reduce among leaders, broadcast."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm import DEFAULT_BUCKET_BYTES, pack, unpack
from dssync.comm.align import align_rest
from dssync.comm.averager import Router
from dssync.comm.exchange import broadcast_tensors, wait
from dssync.comm.inflight import lend
from dssync.comm.tags import ALL, Tag
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError
from dssync.lab.baselines.protocol import LabStrategy
from dssync.topology import Topology


class Hierarchical(LabStrategy):
    """Gradients averaged in three stages over the topology's domains (racks, else hosts).

    1. reduce every bucket to the domain's leader (its lowest rank) inside the domain;
    2. all-reduce among the leaders, one per domain;
    3. broadcast the sum back inside each domain, and divide by the world size.

    Gradients are packed into flat buckets of at most ``bucket_bytes`` (the same pack/unpack as
    every strategy) so each stage moves a few large buffers. Every rank ends with exactly the
    global mean gradient, as with DDP. Floating buffers (batch-norm statistics) are averaged over
    all ranks after each optimizer step through the averaging core, unless ``average_buffers=False``.
    Topology ranks are ranks of ``process_group`` (default: the world).

    Example (under torchrun or :func:`dssync.lab.launch.spawn`)::

        topo = dssync.topology.detect()
        strategy = Hierarchical(model, topo)
        loss.backward(); strategy.after_backward(); optimizer.step(); strategy.step()
    """

    name = "hierarchical"

    def __init__(
        self,
        module: nn.Module,
        topology: Topology | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        broadcast_init: bool = True,
        process_group: dist.ProcessGroup | None = None,
        average_buffers: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(module, process_group)
        if not dist.is_initialized():
            raise UsageError(
                "torch.distributed is not initialized; call dist.init_process_group() first"
            )
        self.parent = process_group if process_group is not None else dist.group.WORLD
        self.world_size, self.rank = dist.get_world_size(self.parent), dist.get_rank(self.parent)
        if topology is None:
            from dssync.topology import detect

            topology = detect()
        if topology.world_size != self.world_size:
            raise UsageError(
                f"topology has {topology.world_size} ranks but the job has {self.world_size}; "
                "detect it in this job (dssync.topology.detect())"
            )
        self.topology = topology
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.steps = 0
        domains = topology.domains()
        self.domain = next(d for d in domains if self.rank in d)
        self.leader = self._global(self.domain[0])
        self.leaders = [d[0] for d in domains]
        self._local = self._leader_pg = None
        for d in domains:  # every rank creates every group, in the same order
            pg = self._new_group(d) if 1 < len(d) < self.world_size else None
            if self.rank in d:
                self._local = self.parent if len(d) == self.world_size else pg
        pg = self._new_group(self.leaders) if len(self.leaders) > 1 else None
        if self.rank in self.leaders:
            self._leader_pg = pg
        self.router = Router(process_group, None, timeout_s, bucket_bytes)
        self._buffers = (
            [b for b in module.buffers() if b.is_floating_point()] if average_buffers else []
        )
        if broadcast_init:
            with torch.no_grad():
                broadcast_tensors(
                    list(module.parameters()) + list(module.buffers()),
                    0,
                    process_group,
                    timeout_s,
                    self.router.roll,
                )

    def close(self) -> None:
        """Destroy the domain and leader groups this strategy made (every rank)."""
        made = {pg for pg in (self._local, self._leader_pg) if pg is not None}
        for pg in made - {self.parent}:
            dist.destroy_process_group(pg)
        self._local = self._leader_pg = None

    def _global(self, r: int) -> int:
        return r if self.parent is dist.group.WORLD else dist.get_global_rank(self.parent, r)

    def _new_group(self, ranks: list[int]) -> dist.ProcessGroup:
        timeout = timedelta(seconds=self.timeout_s)
        return dist.new_group([self._global(r) for r in ranks], timeout=timeout)

    @torch.no_grad()
    def after_backward(self) -> None:
        params = [p for p in self.module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        with self.syncing():
            flats = pack([p.grad for p in params], self.bucket_bytes)
            for flat, _ in flats:
                self.reduce(flat)
                flat.div_(self.world_size)
            unpack(flats)

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        if self._buffers:
            with self.syncing():
                self.router.average(range(self.world_size), ALL, self.steps, tensors=self._buffers)

    def reduce(self, flat: torch.Tensor) -> None:
        """Leave the sum over all ranks of ``flat`` in ``flat`` on every rank (all ranks call)."""
        deadline = time.monotonic() + self.timeout_s
        tag, members = Tag(ALL, self.steps, flat.numel()), list(range(self.world_size))
        lend([flat])

        def done(work, pg: dist.ProcessGroup) -> None:
            wait(work, deadline, tag, members, self.timeout_s, process_group=pg)

        if self._local is self.parent:
            done(dist.all_reduce(flat, group=self.parent, async_op=True), self.parent)
            return
        if self._local is not None:
            done(dist.reduce(flat, dst=self.leader, group=self._local, async_op=True), self._local)
        if self._leader_pg is not None:
            done(dist.all_reduce(flat, group=self._leader_pg, async_op=True), self._leader_pg)
        if self._local is not None:
            done(
                dist.broadcast(flat, src=self.leader, group=self._local, async_op=True), self._local
            )

    @torch.no_grad()
    def average_all(self) -> None:
        """Parameters are alike (every rank applies the same mean gradient): the floating
        buffers are averaged once more (a forward since the last step moved them), and the
        rest follows rank 0."""
        with self.syncing():
            if self._buffers:
                self.router.average(range(self.world_size), ALL, self.steps, tensors=self._buffers)
            averaged = [*self.module.parameters(), *self._buffers]
            align_rest(self.module, averaged, self.process_group, self.timeout_s)
