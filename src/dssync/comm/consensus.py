"""Collectives over whole models: how far apart the ranks are, and whether they agree at start-up.

Both are metadata, not training: they run on the side group (:func:`dssync.comm.side.side_group`,
gloo) on CPU tensors, never on the training group, so they work the same under nccl and gloo.
The fingerprints are a few int64 values; consensus distance copies the parameters to the host once
in float64 (exact, and a diagnostic run at the end or every few epochs, not every step).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm.side import side_group
from dssync.errors import UsageError
from dssync.hashing import fingerprint


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """All floating parameters of ``module`` as one float64 vector (a copy)."""
    return torch.cat(
        [
            p.detach().reshape(-1).double().cpu()
            for p in module.parameters()
            if p.is_floating_point()
        ]
    )


def consensus_distance(module: nn.Module, group: dist.ProcessGroup | None = None) -> float:
    """Mean over ranks of ||x_i - mean||^2 / ||mean||^2, where x_i is rank i's parameter vector.

    0 when every rank holds the same model. All ranks of ``group`` call this. Computed in float64
    on the host and exchanged on ``group``'s side group (two all_reduces: the sum of the vectors,
    then the sum of squared distances), so nothing but the parameters' bytes moves to the host.
    """
    side = side_group(group)
    x = flat_parameters(module)
    n = dist.get_world_size(group)
    mean = x.clone()
    dist.all_reduce(mean, group=side)
    mean /= n
    d = torch.tensor([float(torch.sum((x - mean) ** 2))], dtype=torch.float64)
    dist.all_reduce(d, group=side)
    return float(d) / n / max(float(torch.sum(mean**2)), 1e-30)


def fingerprint_check(
    values: dict[str, int],
    group: dist.ProcessGroup | None = None,
    fixes: dict[str, str] | None = None,
) -> None:
    """All ranks pass the same named 63-bit fingerprints; raise UsageError naming the ranks that differ.

    Cheap (one all_gather of a few int64 values on ``group``'s side group) and run once at
    construction. Every rank raises the same error, naming the ranks outside the majority.
    """
    names = sorted(values)
    mine = torch.tensor([values[k] for k in names], dtype=torch.int64)
    n = dist.get_world_size(group)
    gathered = [torch.zeros_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine, group=side_group(group))
    for i, name in enumerate(names):
        column = [int(g[i]) for g in gathered]
        if len(set(column)) > 1:
            odd = _minority(column)
            fix = (fixes or {}).get(name, "")
            raise UsageError(
                f"ranks disagree on the {name}: ranks {odd} differ from rank "
                f"{column.index(_majority(column))}{'; ' + fix if fix else ''}"
            )


def _majority(column: list[int]) -> int:
    """The most common value; on a tie, the one the lowest rank holds (rank 0 is the reference)."""
    return max(column, key=lambda v: (column.count(v), -column.index(v)))


def _minority(column: list[int]) -> list[int]:
    common = _majority(column)
    return [r for r, v in enumerate(column) if v != common]


def module_fingerprint(tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """A 63-bit hash of names, shapes and dtypes (not values) of named tensors."""
    text = ";".join(f"{name}:{tuple(t.shape)}:{t.dtype}" for name, t in tensors)
    return fingerprint(text)
