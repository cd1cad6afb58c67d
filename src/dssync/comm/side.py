"""The side group: a CPU-capable twin of a training group, for everything that is not parameter data.

Design (device-correct by construction):

* Parameter data (buckets, optimizer state, and anything that rides inside a bucket) lives on
  the parameters' device and moves through the user's training group: nccl on GPUs, gloo on CPUs.
* Everything else is small CPU metadata: start-up agreement (fingerprints), consensus distance,
  topology detection, the link probe's barriers and results, timings, and finding which ranks
  never came after a timeout. It goes through :func:`side_group`, a gloo group over the same
  ranks, made once per training group and cached. When the training group already runs gloo it
  is its own side group, so a CPU job opens no extra sockets.
* One exchange rides the training group although it carries no parameters, because what it
  serves is the training group's own behaviour: the link probe's timed transfers (to measure the
  links training uses). It sends tensors of the parameters' dtype on the parameters' device.

nccl refuses CPU tensors, so a collective that sent metadata through an nccl training group would
fail before the first step; routing it here keeps the GPU path correct without any copy to the
device and back. The test backend in ``tests/comm/strict_backend.py`` refuses, on the CPU, what
nccl would refuse, and every strategy runs on it in ``tests/comm/test_device_split.py``.

Example::

    side = side_group(process_group)          # every rank of process_group calls this alike
    dist.all_reduce(torch.zeros(3, dtype=torch.float64), group=side)
"""

from __future__ import annotations

import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

_SIDE: dict[dist.ProcessGroup, dist.ProcessGroup] = {}


def side_group(
    group: dist.ProcessGroup | None = None, timeout_s: float | None = None
) -> dist.ProcessGroup:
    """A gloo group over the ranks of ``group`` (default: the world); ``group`` itself if gloo.

    The first call for a group is collective: every rank of ``group`` must make it, in the same
    order relative to other group creations (as with ``dist.new_group``). Later calls are free.
    The twin's timeout is ``timeout_s`` if given, else the training group's own (so a lost peer
    fails a metadata exchange as soon as it would fail training), else torch's default.
    """
    pg = group if group is not None else dist.group.WORLD
    if dist.get_backend(pg) == dist.Backend.GLOO:
        return pg
    if pg not in _SIDE:
        ranks = dist.get_process_group_ranks(pg)
        local = len(ranks) != dist.get_world_size()
        timeout = timedelta(seconds=timeout_s) if timeout_s else timeout_of(pg)
        _SIDE[pg] = dist.new_group(
            ranks, backend="gloo", timeout=timeout, use_local_synchronization=local
        )
    return _SIDE[pg]


def serving_process_group(ranks: list[int], timeout_s: float) -> dist.ProcessGroup:
    """A fresh gloo group over ``ranks`` for point-to-point traffic from a background thread
    (a parameter server's requests, a passive's answers), made once at construction.

    Collective over ``ranks`` only (local synchronization) when they are not the whole world.
    Unlike :func:`side_group` it is never cached or shared: a serving thread's pending receive
    must not meet another exchange's message on the same group. ``timeout_s`` bounds every wait
    on it (a serving thread's wait for the next request included).
    """
    local = len(ranks) != dist.get_world_size()
    return dist.new_group(
        ranks,
        backend="gloo",
        timeout=timedelta(seconds=timeout_s),
        use_local_synchronization=local,
    )


def renamed_group(
    process_group: dist.ProcessGroup | None, group: dist.ProcessGroup | None, where: str
) -> dist.ProcessGroup | None:
    """``process_group``, or the older keyword ``group`` (a ProcessGroup) with a warning: in
    public names ``group`` is a list of ranks, ``process_group`` a ProcessGroup."""
    if group is None:
        return process_group
    if process_group is not None:
        raise TypeError(f"{where}: pass process_group= only (group= is its older name)")
    warnings.warn(
        f"{where}(group=...) is now {where}(process_group=...)", DeprecationWarning, stacklevel=3
    )
    return group


def timeout_of(group: dist.ProcessGroup) -> timedelta | None:
    """The timeout ``group`` was made with, where its backend tells (gloo, nccl); else None."""
    for device_type in getattr(group, "_device_types", []):
        try:
            backend = group._get_backend(torch.device(device_type))
            timeout = backend.options._timeout
        except (AttributeError, RuntimeError):
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return None


def forget_side_groups() -> None:
    """Drop cached side groups (call before ``dist.destroy_process_group()`` re-initializes)."""
    _SIDE.clear()
