"""A test process-group backend, "strict": gloo that refuses what nccl would refuse on a training group.

nccl accepts only tensors on the GPU. On a CPU-only machine every tensor is a CPU tensor, so
``.device`` cannot tell parameter data from host-side metadata; the strict group uses a rule that
can be checked here instead:

* **dtype.** It accepts only tensors of :data:`DATA_DTYPE` (float16), the dtype the tests give
  their models. Metadata made without looking at the parameters (int64 fingerprints, float64
  statistics, a ``torch.zeros(1)`` line-up in the default float32) is refused, as nccl would
  refuse it for living on the CPU. Exception: torch's own ``DistributedDataParallel`` sends an
  int64 shape check and int64 buffers through the group; on nccl it places them on the
  parameters' device, so calls made from inside ``torch/nn/parallel/distributed.py`` pass.
  dssync's own step tags (int64, made on the data's device: :func:`_is_tag`) pass too.
* **wire formats.** dssync's compressed messages (``wire=``) are bfloat16, float16 or int8 (an
  int8 message carries its scales in its own bytes), made by the codec from the parameters on
  their device; dssync makes no metadata in those dtypes, so they pass as training data.
* **operations.** ``monitored_barrier`` and ``recv_anysource`` (gloo only), sparse tensors, and the
  bitwise reductions are refused, as nccl refuses them.

What it cannot catch: a tensor that has the parameters' dtype but was placed on the CPU
(``torch.zeros(1, dtype=p.dtype)`` without ``device=p.device``). Code that makes its training-group
tensors from the parameters (``torch.zeros(1, dtype=p.dtype, device=p.device)``) passes here and
on nccl alike; that is the habit this backend enforces.

Example (inside a worker started by :func:`dssync.lab.launch.spawn`)::

    import strict_backend
    strict_backend.use_strict_world()     # the default group is now "strict"
    dist.all_reduce(torch.ones(1, dtype=torch.float64))   # raises Refused
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from dssync.comm.side import forget_side_groups
from dssync.comm.tags import FIELDS

NAME = "strict"
DATA_DTYPE = torch.float16
WIRE_DTYPES = (torch.bfloat16, torch.int8)  # compressed messages of the parameters (wire=)
TRUSTED_FILE = "torch/nn/parallel/distributed.py"  # DDP: device-correct on nccl by construction
BITWISE = {dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR}


class Refused(RuntimeError):
    """The strict group refused a collective that nccl would refuse."""


def _tensors(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _is_tag(t: torch.Tensor) -> bool:
    """dssync's step tag: int64 ``[kind, step, layout, finite]`` (point to point), or ``[t, -t]``
    (MAX) followed by one non-finite slot per member of the group.

    The averaging core makes it on the data's device (``Tag.tensor(device)``), so nccl takes it;
    it is recognised here by dtype and size, the one int64 shape the training group may carry.
    """
    return t.dtype == torch.int64 and (
        t.numel() == FIELDS or 2 * FIELDS <= t.numel() <= 2 * FIELDS + 64
    )


def _from_ddp() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.replace("\\", "/").endswith(TRUSTED_FILE):
            return True
        frame = frame.f_back
    return False


class StrictGroup(dist.ProcessGroup):
    """A process group that checks every collective, then runs it on a wrapped ProcessGroupGloo."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._name = ""
        self.inner = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self) -> str:  # noqa: N802 - the name torch calls
        return NAME

    def _set_group_name(self, name: str) -> None:  # a Python group keeps its own name
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def _admit(self, op: str, args: tuple) -> None:
        for t in _tensors(args):
            if t.is_sparse:
                raise Refused(
                    f"strict group refused {op} of a sparse tensor (nccl has no sparse path)"
                )
            data = t.dtype == DATA_DTYPE or t.dtype in WIRE_DTYPES
            if not data and not _is_tag(t) and not _from_ddp():
                raise Refused(
                    f"strict group refused {op} of a {t.dtype} tensor of shape {tuple(t.shape)}: "
                    f"training data is {DATA_DTYPE}; metadata on nccl must go through side_group()"
                )
        opts = args[-1] if args else None
        if getattr(opts, "reduceOp", None) in BITWISE:
            raise Refused(f"strict group refused {op} with a bitwise reduction (nccl has none)")

    def monitored_barrier(self, *args):
        raise Refused("strict group refused monitored_barrier (gloo only; nccl has none)")

    def recv_anysource(self, *args):
        raise Refused("strict group refused recv_anysource (gloo only; nccl has none)")


def _checked(op: str):
    def method(self: StrictGroup, *args, **kwargs):
        self._admit(op, (*args, *kwargs.values()))
        return getattr(self.inner, op)(*args, **kwargs)

    method.__name__ = op
    return method


for _op in (
    "allreduce",
    "allreduce_coalesced",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "alltoall",
    "alltoall_base",
    "gather",
    "scatter",
    "send",
    "recv",
    "barrier",
):
    setattr(StrictGroup, _op, _checked(_op))


def _create(opts, _backend_options) -> StrictGroup:
    """The extended creator: it is told the group's name, which destroy_process_group needs."""
    pg = StrictGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    pg._set_group_name(opts.group_id)
    return pg


def register() -> None:
    """Make ``backend="strict"`` known to torch.distributed in this process (idempotent)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])


def use_strict_world(timeout_s: float = 30.0) -> None:
    """Replace the default (gloo) group of this worker by a strict one over the same ranks.

    Every rank calls this. It reuses the store of the group :func:`dssync.lab.launch.spawn` made, so
    groups made later with the default backend (``dist.new_group(ranks)``) are strict too.
    """
    register()
    store = c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    forget_side_groups()
    dist.destroy_process_group()
    dist.init_process_group(
        NAME,
        store=dist.PrefixStore("strict", store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
