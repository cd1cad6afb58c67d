"""Collectives over whole models: how far apart the ranks are, and whether they agree at start-up.

Both are metadata, not training: they run on the side group (:func:`dssync.comm.side.side_group`,
gloo) on CPU tensors, never on the training group, so they work the same under nccl and gloo.
The fingerprints are a few int64 values; consensus distance copies the parameters to the host once
in float64 (exact, and a diagnostic run at the end or every few epochs, not every step).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from dssync.comm.meta import bounded, gather_objects
from dssync.comm.side import renamed_group, side_group
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError
from dssync.hashing import fingerprint


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """All floating parameters of ``module`` as one float64 vector (a copy); of a sharded
    (DTensor) parameter, this rank's local shard."""
    return torch.cat(
        [
            (p.to_local() if isinstance(p, DTensor) else p).detach().reshape(-1).double().cpu()
            for p in module.parameters()
            if p.is_floating_point()
        ]
    )


def shard_group(module: nn.Module) -> dist.ProcessGroup | None:
    """The group over which ``module``'s parameters are sharded (FSDP2 on one mesh dimension),
    None for a plain model."""
    meshes = {
        id(p.device_mesh): p.device_mesh for p in module.parameters() if isinstance(p, DTensor)
    }
    if not meshes:
        return None
    if len(meshes) > 1 or next(iter(meshes.values())).ndim != 1:
        raise UsageError(
            "consensus_distance measures a model sharded over one mesh dimension (fully_shard("
            "model, mesh=mesh['shard']) with DSSync across replicas); this one's parameters "
            "live on another mesh (FSDP2's HSDP on the 2-D mesh keeps its replicas equal: "
            "their distance is 0)"
        )
    return next(iter(meshes.values())).get_group()


def consensus_distance(
    module: nn.Module,
    process_group: dist.ProcessGroup | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    group: dist.ProcessGroup | None = None,
) -> float:
    """Mean over ranks of ||x_i - mean||^2 / ||mean||^2, where x_i is rank i's parameter vector.

    0 when every rank holds the same model. All ranks of ``process_group`` (``group=``: its
    deprecated older name) call this. For a model sharded with FSDP2 (DS-Sync across replicas,
    ``process_group`` the replicas' group), x_i is replica i's full model: each rank measures its
    local shards and the shards' sums are added up, so every rank of every replica calls this. Computed in float64 on the host and exchanged on its side
    group (two all_reduces: the sum of the vectors,
    then the sum of squared distances), so nothing but the parameters' bytes moves to the host.
    Each waits at most ``timeout_s``.
    """
    group = renamed_group(process_group, group, "consensus_distance")
    side = side_group(group, timeout_s)
    what = "the consensus distance"
    x = flat_parameters(module)
    n = dist.get_world_size(group)
    mean = x.clone()
    bounded(dist.all_reduce, mean, group=side, timeout_s=timeout_s, what=what)
    mean /= n
    sums = torch.tensor([float(torch.sum((x - mean) ** 2)), 0.0], dtype=torch.float64)
    bounded(dist.all_reduce, sums, group=side, timeout_s=timeout_s, what=what)
    sums[1] = float(torch.sum(mean**2))
    shards = shard_group(module)
    if shards is not None:  # the shards' pieces of both sums, over this replica's ranks
        bounded(
            dist.all_reduce,
            sums,
            group=side_group(shards, timeout_s),
            timeout_s=timeout_s,
            what=what,
        )
    return float(sums[0]) / n / max(float(sums[1]), 1e-30)


def agree(
    values: dict[str, Any],
    group: dist.ProcessGroup | None = None,
    fixes: dict[str, str] | None = None,
    refusal: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    what: str = "the start-up agreement",
) -> None:
    """Every rank passes the same named values; else every rank raises the same UsageError.

    ``values`` are short descriptions (a fingerprint is shown in hex); ``refusal`` is this
    rank's own objection to the configuration (an error it would raise alone), told to the
    others before anyone raises. One gather of small objects on ``group``'s side group, bounded
    by ``timeout_s`` (PeerLost naming the ranks that never came). The error names, for each value
    the ranks disagree on, what the reference rank (the majority, rank 0 on a tie) has and what
    each odd rank has, then the fix; and each rank's refusal.
    """
    mine = ({k: _show(v) for k, v in values.items()}, refusal)
    side = side_group(group, timeout_s)
    everyone = gather_objects(mine, side, timeout_s, what)
    problems = []
    for name in sorted({k for shown, _ in everyone for k in shown}):
        column = [shown.get(name, "(nothing)") for shown, _ in everyone]
        if len(set(column)) > 1:
            common = _majority(column)
            ref, odd = column.index(common), _minority(column)
            has = ", ".join(f"rank {r} has {column[r]}" for r in [ref, *odd[:3]])
            fix = (fixes or {}).get(name, "")
            problems.append(
                f"ranks disagree on the {name}: ranks {odd} differ from rank {ref} ({has})"
                + (f"; {fix}" if fix else "")
            )
    refused = [(r, text) for r, (_, text) in enumerate(everyone) if text]
    if refused and len({text for _, text in refused}) == 1 and len(refused) == len(everyone):
        problems.append(refused[0][1])  # every rank refused alike: its own message says it all
    else:
        problems += [f"rank {r} refused the configuration: {text}" for r, text in refused]
    if problems:
        raise UsageError(" | ".join(problems))


def fingerprint_check(
    values: dict[str, int],
    group: dist.ProcessGroup | None = None,
    fixes: dict[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """All ranks pass the same named 63-bit fingerprints; raise UsageError naming the ranks
    that differ (:func:`agree` with fingerprints; bounded by ``timeout_s``)."""
    agree(values, group, fixes, timeout_s=timeout_s, what="a fingerprint check")


def _show(value: Any) -> str:
    """A short description: text as it is, an integer fingerprint in hex, else its repr."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        text = repr(value)
    else:
        text = value if isinstance(value, str) else f"#{value & (2**64 - 1):x}"
    if len(text) > 100:
        text = f"{text[:70]}... #{fingerprint(text):x}"
    return text


def _majority(column: list[str]) -> str:
    """The most common value; on a tie, the one the lowest rank holds (rank 0 is the reference)."""
    return max(column, key=lambda v: (column.count(v), -column.index(v)))


def _minority(column: list[str]) -> list[int]:
    common = _majority(column)
    return [r for r, v in enumerate(column) if v != common]


def module_fingerprint(tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """A 63-bit hash of names, shapes and dtypes (not values) of named tensors."""
    text = ";".join(f"{name}:{tuple(t.shape)}:{t.dtype}" for name, t in tensors)
    return fingerprint(text)
