"""Metadata collectives with a deadline: what is not parameter data, bounded by ``timeout_s``.

torch's blocking collectives wait as long as their group's timeout (30 minutes by default for a
group made by ``init_process_group``). :func:`bounded` starts a collective without blocking and
waits for it at most ``timeout_s``; on failure it raises :class:`~dssync.errors.PeerLost` saying
what the wait was, which ranks never came (each rank writes a key into the store before it
starts, so the missing are known at once) and what happened after how long (silent past the
timeout, or a connection that closed). :func:`gather_objects` gathers a small picklable object
from every rank (two bounded all_gathers), :func:`from_first` shares the first rank's (two
bounded broadcasts), and :func:`slowest` is the largest of every rank's time. Callers pass the
side group (:func:`dssync.comm.side.side_group`) for CPU metadata.

Example::

    bounded(dist.all_reduce, t, group=side, timeout_s=60, what="the consensus distance")
    everyone = gather_objects({"schedule": "Shuffle(2)"}, side, timeout_s=60, what="start-up")
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dssync.comm.exchange import RollCall, wait
from dssync.comm.inflight import lend
from dssync.comm.tags import META, Tag

_calls: dict[tuple[int, ...], int] = {}  # bounded calls per group: every rank counts alike


def bounded(
    op: Callable[..., Any],
    /,
    *args: Any,
    group: dist.ProcessGroup | None = None,
    timeout_s: float,
    what: str,
    **kwargs: Any,
) -> None:
    """``op(*args, group=group, async_op=True, **kwargs)``, waited for at most ``timeout_s``.

    Collective: every rank of ``group`` calls it alike. Raises PeerLost naming ``what``.
    ``op`` is positional-only, so a collective's own ``op=`` (``dist.ReduceOp.MAX``) passes on.
    """
    pg = group if group is not None else dist.group.WORLD
    key = tuple(dist.get_process_group_ranks(pg))
    _calls[key] = _calls.get(key, 0) + 1
    tag = Tag(META, _calls[key], 0)
    members = list(range(len(key)))
    roll = RollCall(pg, window_s=0.0).arrive(members, tag)
    lend(t for a in args for t in (a if isinstance(a, list) else [a]) if torch.is_tensor(t))
    work = op(*args, group=pg, async_op=True, **kwargs)
    wait(
        work,
        time.monotonic() + timeout_s,
        tag,
        members,
        timeout_s,
        roll=roll,
        what=what,
        process_group=pg,
    )


def slowest(seconds: float, group: dist.ProcessGroup | None, timeout_s: float, what: str) -> float:
    """The largest of every rank's ``seconds`` (a bounded MAX all_reduce, like :func:`bounded`)."""
    return largest([seconds], group, timeout_s, what)[0]


def largest(
    values: list[float], group: dist.ProcessGroup | None, timeout_s: float, what: str
) -> list[float]:
    """Each of ``values``' largest over every rank, in one bounded MAX all_reduce."""
    t = torch.tensor(values, dtype=torch.float64)
    bounded(dist.all_reduce, t, op=dist.ReduceOp.MAX, group=group, timeout_s=timeout_s, what=what)
    return t.tolist()


def gather_objects(
    obj: Any, group: dist.ProcessGroup | None, timeout_s: float, what: str
) -> list[Any]:
    """Every rank's ``obj`` (small, picklable), in group rank order; bounded like :func:`bounded`."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    n = dist.get_world_size(group)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(n)]
    bounded(dist.all_gather, sizes, size, group=group, timeout_s=timeout_s, what=what)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: data.numel()] = data
    out = [torch.zeros_like(padded) for _ in range(n)]
    bounded(dist.all_gather, out, padded, group=group, timeout_s=timeout_s, what=what)
    return [
        pickle.loads(o[: int(s.item())].numpy().tobytes()) for o, s in zip(out, sizes, strict=True)
    ]


def from_first(obj: Any, group: dist.ProcessGroup | None, timeout_s: float, what: str) -> Any:
    """The ``obj`` (small, picklable) of the group's first rank, on every rank (what the others
    pass is ignored); bounded like :func:`bounded`."""
    pg = group if group is not None else dist.group.WORLD
    src = dist.get_global_rank(pg, 0)
    first = dist.get_rank() == src
    data = pickle.dumps(obj) if first else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    bounded(dist.broadcast, size, src, group=pg, timeout_s=timeout_s, what=what)
    buf = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if first
        else torch.zeros(int(size.item()), dtype=torch.uint8)
    )
    bounded(dist.broadcast, buf, src, group=pg, timeout_s=timeout_s, what=what)
    return obj if first else pickle.loads(buf.numpy().tobytes())
