"""Topology from the launcher's environment: DSSYNC_HOST/DSSYNC_RACK, or host names, or LOCAL_WORLD_SIZE.

* ``DSSYNC_HOST`` on a worker names its host outright (tests; launchers without host names).
* Under torchrun each rank contributes a hash of its host name (and ``DSSYNC_RACK`` when the job
  sets it) to one small all_gather; the emulated cluster runs torchrun on every host with a host
  name of its own and ``DSSYNC_RACK`` set, so it takes this path too.
* Without a process group, ranks are assumed to fill hosts in blocks of ``LOCAL_WORLD_SIZE``.

The host and rack keys are metadata: they travel on the training group's side group (gloo, CPU
int64 tensors, :func:`dssync.comm.side.side_group`), never on the training group itself. The
optional probe measures links with training data instead (see :mod:`dssync.topology.probe`).
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping

import torch
import torch.distributed as dist

from dssync.comm.meta import bounded
from dssync.comm.side import renamed_group, side_group
from dssync.comm.wait import DEFAULT_TIMEOUT_S
from dssync.errors import UsageError
from dssync.topology.model import Topology


def from_env(world_size: int | None = None, environ: Mapping[str, str] | None = None) -> Topology:
    """A topology without communication: rank r sits on host r // LOCAL_WORLD_SIZE, all in one rack.

    Example::

        >>> from_env(4, {"LOCAL_WORLD_SIZE": "2"}).hosts
        (0, 0, 1, 1)
    """
    env = os.environ if environ is None else environ
    world = int(world_size if world_size is not None else env.get("WORLD_SIZE", "1"))
    per_host = int(env.get("LOCAL_WORLD_SIZE", world))
    if per_host < 1 or world % per_host:
        raise UsageError(
            f"LOCAL_WORLD_SIZE={per_host} does not divide WORLD_SIZE={world}; launch the same "
            "number of workers on every host, or set DSSYNC_HOST on each worker"
        )
    return Topology(hosts=tuple(r // per_host for r in range(world)), racks=(0,) * world)


def detect(
    process_group: dist.ProcessGroup | None = None,
    probe: bool = False,
    probe_bytes: int = 2_000_000,
    probe_rounds: int = 7,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    group: dist.ProcessGroup | None = None,
) -> Topology:
    """Which ranks share a host and a rack (one all_gather), and optionally how fast links are.

    All ranks of ``process_group`` call this. With ``probe=True`` a short, bounded bandwidth
    probe (:func:`dssync.topology.probe_bandwidth`) fills in link rates and slow hosts; it sends
    ``dtype`` tensors on ``device`` (give the parameters' device and dtype) through
    ``process_group``'s backend, as training will. ``group=`` is the deprecated older name of
    ``process_group=``.
    """
    group = renamed_group(process_group, group, "detect")
    if not dist.is_initialized():
        return from_env()
    mine = torch.tensor([_host_key(), int(os.environ.get("DSSYNC_RACK", -1))], dtype=torch.int64)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    side = side_group(group, timeout_s)
    bounded(
        dist.all_gather, gathered, mine, group=side, timeout_s=timeout_s, what="topology detection"
    )
    hosts = _renumber([int(g[0]) for g in gathered])
    racks_raw = [int(g[1]) for g in gathered]
    racks = (0,) * len(hosts) if all(k < 0 for k in racks_raw) else _renumber(racks_raw)
    topo = Topology(hosts=hosts, racks=racks)
    if probe:
        from dssync.topology.probe import probe_bandwidth

        topo = probe_bandwidth(
            topo,
            nbytes=probe_bytes,
            rounds=probe_rounds,
            timeout_s=timeout_s,
            group=group,
            device=device,
            dtype=dtype,
        )
    return topo


def _host_key() -> int:
    """DSSYNC_HOST when set, else a 62-bit hash of the host name."""
    if "DSSYNC_HOST" in os.environ:
        return int(os.environ["DSSYNC_HOST"])
    digest = hashlib.sha256(socket.gethostname().encode()).digest()
    return (int.from_bytes(digest[:8], "little") >> 2) + 1_000_000


def _renumber(keys: list[int]) -> tuple[int, ...]:
    """Map keys to 0, 1, ... in order of first appearance."""
    ids: dict[int, int] = {}
    return tuple(ids.setdefault(k, len(ids)) for k in keys)
