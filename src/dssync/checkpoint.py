"""Checkpoints through torch.distributed.checkpoint (DCP): model, optimizer and DSSync's state.

One call on every rank saves (or loads) one checkpoint folder, for a model sharded with FSDP2
(``DSSync`` across replicas, :mod:`dssync.strategies.sharded`) as for a plain one:

* The model and the optimizer go through ``get_state_dict`` / ``set_state_dict``
  (``torch.distributed.checkpoint.state_dict``) and ``dcp.save`` / ``dcp.load``, so a sharded
  parameter is written as its shards and read back into any other sharding (2 shards saved,
  1 or 4 loaded). Between averagings each replica holds its own model, so each replica's is
  kept apart, under ``replica<i>.`` (``i``: the rank in ``sync``'s process group; in a plain
  run, every rank is a replica). DCP writes a tensor that several ranks hold alike once, so the
  shards of one replica are written once each.
* DSSync's own state (:meth:`~dssync.DSSync.state_dict`: the step and averaging counts, the outer
  step's anchors and momentum, the wire's residuals) is written per rank, as bytes.

Resuming, the rule (``docs/guide/sharded.md``):

* **The same world** (as many ranks, as many replicas, the same local shard shapes): every rank
  loads its own replica's model and optimizer and its own DSSync state; the run continues with
  bit-identical parameters to one that was not interrupted.
* **Another world** (another shard count or replica count): replica ``i`` loads the model and
  optimizer of saved replica ``i mod R`` (``R`` replicas saved), resharded by DCP. Of DSSync's
  state, the step and averaging counts carry over (the schedule continues where it was); the
  wire's residuals start from zero and the outer step's anchors restart from the loaded
  parameters with no outer momentum (their pieces belong to the old layout), with a warning.
  To start every replica of the new world from one model, call ``sync.average_all()`` before
  saving; with ``outer=``, save right after an averaging (``sync.steps % every == 0``).

Example (every rank; construct ``DSSync`` first, then load: its start-up broadcast would
overwrite a model loaded before it)::

    from dssync import checkpoint
    checkpoint.save("ckpt/step100", model, opt, sync)
    ...
    model, opt, sync = make()
    checkpoint.load("ckpt/step100", model, opt, sync)
"""

from __future__ import annotations

import io
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from dssync.hashing import fingerprint
from dssync.strategies.sharded import like_tree, local, to_local_tree

WORLD = "dssync.world"


def _world(model: torch.nn.Module, sync: Any) -> dict[str, Any]:
    """What decides whether a checkpoint's DSSync state fits this rank: its own layout."""
    shapes = ";".join(f"{n}:{tuple(local(p).shape)}" for n, p in model.named_parameters())
    return {
        "world_size": dist.get_world_size(),
        "replicas": sync.world_size,
        "shards": fingerprint(shapes),
    }


def save(
    path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync: Any
) -> None:
    """Save ``model``, ``optimizer`` and ``sync``'s state to the folder ``path`` with DCP
    (collective: every rank calls it alike). Saving does not change the run."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    buf = io.BytesIO()
    torch.save({"world": _world(model, sync), "sync": to_local_tree(sync.state_dict())}, buf)
    state = {
        f"replica{sync.rank}": {"model": model_sd, "optim": optim_sd},
        f"dssync.rank{dist.get_rank()}": buf.getvalue(),
        WORLD: [dist.get_world_size(), sync.world_size],  # a list of ints: one DCP item
    }
    dcp.save(state, checkpoint_id=os.fspath(path))


def load(
    path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync: Any
) -> None:
    """Load what :func:`save` wrote into ``model``, ``optimizer`` and ``sync`` (collective;
    after constructing ``sync``). In another world, the rule of the module docstring."""
    path = os.fspath(path)
    head: dict[str, Any] = {WORLD: [0, 0]}
    dcp.load(head, checkpoint_id=path)
    world_size, replicas = head[WORLD]
    model_sd, optim_sd = get_state_dict(model, optimizer)
    source = f"replica{sync.rank % int(replicas)}"
    state: dict[str, Any] = {source: {"model": model_sd, "optim": optim_sd}}
    mine = f"dssync.rank{dist.get_rank()}"
    same_world = int(world_size) == dist.get_world_size()
    if same_world:
        state[mine] = b""
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    ours = sync.state_dict()
    theirs = torch.load(io.BytesIO(state[mine]), weights_only=False) if same_world else None
    if theirs is not None and theirs["world"] == _world(model, sync):
        sync.load_state_dict(like_tree(theirs["sync"], _template(ours, theirs["sync"])))
        return
    _load_counts(sync, ours, theirs, head, path)


def _template(ours: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """This run's state, with the outer optimizer's state laid out as the saved one's: its
    moments take the layout of their anchors (a fresh outer optimizer has no state yet)."""
    if "outer" not in ours or "outer" not in saved:
        return ours
    anchors = ours["outer"]["anchors"]
    state = saved["outer"]["optimizer"].get("state", {})
    template = {i: {k: anchors[i] for k in s} for i, s in state.items()}
    return {**ours, "outer": {**ours["outer"], "optimizer": {"state": template}}}


def _load_counts(sync: Any, ours: dict, theirs: dict | None, head: dict, path: str) -> None:
    """Another world: the counts carry over, the per-rank tensors restart (module docstring)."""
    if theirs is None:  # rank 0's counts: every rank counts alike
        first: dict[str, Any] = {"dssync.rank0": b""}
        dcp.load(first, checkpoint_id=path)
        theirs = torch.load(io.BytesIO(first["dssync.rank0"]), weights_only=False)
    counts = theirs["sync"]
    state = {**ours, "steps": counts["steps"], "averagings": counts["averagings"]}
    if "schedule" in counts:
        state["schedule"] = counts["schedule"]
    restarted = [k for k in ("outer", "wire") if k in ours]
    if "outer" in ours:
        with torch.no_grad():
            anchors = [p.detach().clone() for p in sync.outer.params]
        fresh = sync.outer.optimizer.state_dict()
        state["outer"] = {"anchors": anchors, "optimizer": {**fresh, "state": {}}}
    if "wire" in ours:
        state["wire"] = {"format": ours["wire"]["format"], "residuals": []}
    if restarted:
        warnings.warn(
            f"checkpoint {path} was written by {head[WORLD][0]} ranks in "
            f"{head[WORLD][1]} replicas, this run has {dist.get_world_size()} in "
            f"{sync.world_size}: the step counts carry over, DSSync's "
            f"{' and '.join(restarted)} state restarts (anchors from the loaded parameters, "
            "residuals from zero); see docs/guide/sharded.md",
            stacklevel=3,
        )
    sync.load_state_dict(state)
