"""DS-Sync across the replicas of a sharded model (FSDP2's ``fully_shard``, HSDP-style).

A model sharded with FSDP2 over the ``"shard"`` dimension of a 2-D device mesh holds, on each
rank, one local shard of every parameter (a ``DTensor``). ``DSSync(model,
process_group=mesh.get_group("replicate"))`` then averages each rank's local shards with the
ranks that hold the same shard in the other replicas of its group: the schedule runs over
replicas, FSDP2 keeps sharding, all-gathering and reduce-scattering inside each replica.

FSDP2 owns its sharded storage (it all-gathers from it), so the local shards are not re-laid
into DSSync's flat buckets: they are copied into packed buffers, averaged and copied back
(:class:`~dssync.comm.averager.Router`'s ``tensors=`` path, the one optimizer state takes),
read afresh at each averaging because FSDP2 may replace a shard's storage (a state dict loaded
before the first forward). This module holds what is particular to such a model: telling it
apart, the local views, what is refused and what every rank must agree on.

Example (4 ranks: 2 replicas of 2 shards)::

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    fully_shard(model, mesh=mesh["shard"])
    sync = DSSync(model, process_group=mesh.get_group("replicate"), every=4)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from dssync.errors import UsageError
from dssync.hashing import fingerprint

HOW = (
    "shard each replica with fully_shard(model, mesh=mesh['shard']) and pass "
    "process_group=mesh.get_group('replicate') (docs/guide/sharded.md)"
)


def is_sharded(module: nn.Module) -> bool:
    """True when any parameter of ``module`` is a ``DTensor`` (FSDP2, tensor parallel)."""
    return any(isinstance(p, DTensor) for p in module.parameters())


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``t`` as a plain tensor sharing its storage (``t`` if plain)."""
    if isinstance(t, DTensor):
        with torch.no_grad():
            return t.to_local()
    return t


def locals_of(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [local(t) for t in tensors]


def refuse_fsdp1(module: nn.Module) -> None:
    """FSDP1 (``FullyShardedDataParallel``) flattens parameters into its own handles: refused."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
        raise UsageError(
            "the model is wrapped in FullyShardedDataParallel (FSDP1), which DSSync does not "
            f"support; use FSDP2 instead: {HOW}"
        )


def refuse_sharded(module: nn.Module, what: str) -> None:
    """``what`` (a strategy that re-lays the model into flat buckets) cannot take a sharded model."""
    refuse_fsdp1(module)
    if is_sharded(module):
        raise UsageError(
            f"{what} does not support a sharded (DTensor, FSDP2) model: its buckets would take "
            f"over FSDP2's sharded storage; use DSSync across replicas instead ({HOW})"
        )


def refuse_in_door(module: nn.Module, door: str) -> None:
    """``door`` (the Lightning strategy, Accelerate's DSSyncLocal) averages over the whole world
    and takes no ``process_group=``: a sharded model is refused, naming the way that works."""
    refuse_fsdp1(module)
    if is_sharded(module):
        raise UsageError(
            f"{door} does not support a sharded (DTensor, FSDP2) model: it averages over every "
            "rank and has no process_group= for the replicas' group; call DSSync yourself in "
            f"the training loop instead ({HOW})"
        )


def check_sharded(module: nn.Module, options: Any, process_group: dist.ProcessGroup | None) -> None:
    """Refuse, naming the reason and the fix, what averaging local shards cannot do (the
    parameters DSSync averages: trainable ones, frozen ones too with ``average_frozen``)."""
    averaged = [p for p in module.parameters() if p.requires_grad or options.average_frozen]
    named = {id(p): n for n, p in module.named_parameters()}
    plain = [named.get(id(p), "?") for p in averaged if not isinstance(p, DTensor)]
    if plain:
        shown = ", ".join(plain[:3]) + (f" and {len(plain) - 3} more" if len(plain) > 3 else "")
        raise UsageError(
            f"the model mixes sharded (DTensor) parameters with plain ones ({shown}): FSDP2 "
            "does not keep plain parameters alike across the shards of a replica, so averaging "
            "them across replicas cannot give one model; apply fully_shard to the root module "
            "too (it takes the parameters no inner fully_shard took), or freeze them"
        )
    ours = set(dist.get_process_group_ranks(process_group or dist.group.WORLD))
    me = dist.get_rank()
    for p in averaged:
        mesh_ranks = set(p.device_mesh.mesh.flatten().tolist())
        if (mesh_ranks & ours) != {me}:
            raise UsageError(
                f"parameter {named.get(id(p), '?')} is sharded or replicated over ranks "
                f"{sorted(mesh_ranks)}, and {sorted((mesh_ranks & ours) - {me})} of them are in "
                "DSSync's process group: FSDP2 already synchronizes those (HSDP's all-reduce "
                f"when fully_shard is given the 2-D mesh), so DS-Sync must run across the "
                f"others; {HOW}"
            )
    why = {
        "overlap": "an overlapped average keeps snapshots of flat buckets, which FSDP2's own "
        "shards are not; use overlap=False",
        "topology": "topology= places the world's ranks on hosts, and the schedule of a sharded "
        "model runs over replicas (ranks of process_group); pass schedule= instead (Shuffle, "
        "Global, or plan_topology_aware over a Topology of the replicas)",
        "replan": "re-planning needs topology=, refused for a sharded model; use replan=0",
    }
    for name, reason in why.items():
        if getattr(options, name):
            raise UsageError(f"{name}={getattr(options, name)!r} with a sharded model: {reason}")


def agreement(module: nn.Module) -> dict[str, tuple[str, str]]:
    """What the ranks of a replica group must hold alike beyond the global shapes: the shapes of
    their local shards (the same shard of every parameter), for the start-up agreement."""
    shapes = ";".join(f"{n}:{tuple(local(p).shape)}" for n, p in module.named_parameters())
    return {
        "local shards (shapes on this rank)": (
            f"#{fingerprint(shapes):x}",
            "shard every replica alike (the same shard-dimension size and fully_shard calls), "
            "and put ranks holding the same shard in one process_group (mesh.get_group("
            "'replicate'))",
        )
    }


def to_local_tree(obj: Any) -> Any:
    """``obj`` (dicts, lists, tuples of tensors and values) with each DTensor's local piece."""
    if isinstance(obj, DTensor):
        return obj.to_local().detach().clone()
    if isinstance(obj, dict):
        return {k: to_local_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_local_tree(v) for v in obj)
    return obj


def like_tree(obj: Any, template: Any) -> Any:
    """``obj`` from :func:`to_local_tree` with each tensor made a DTensor where ``template``
    (this run's own state, of the same structure) holds one."""
    if isinstance(template, DTensor) and torch.is_tensor(obj) and not isinstance(obj, DTensor):
        return DTensor.from_local(
            obj,
            template.device_mesh,
            template.placements,
            run_check=False,
            shape=template.shape,
            stride=template.stride(),
        )
    if isinstance(obj, dict) and isinstance(template, dict):
        return {k: like_tree(v, template.get(k)) for k, v in obj.items()}
    if isinstance(obj, list | tuple) and isinstance(template, list | tuple):
        if len(obj) == len(template):
            return type(obj)(like_tree(v, t) for v, t in zip(obj, template, strict=True))
    return obj
