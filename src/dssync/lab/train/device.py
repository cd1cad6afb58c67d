"""Where a rank trains: the device, the backend that goes with it, and a clock that waits for it.

``auto`` is CUDA when it is present (the GPU numbered by LOCAL_RANK), else the CPU. On CUDA the
process group is nccl (one GPU per rank), on the CPU gloo. :class:`Clock` binds a device to
:func:`dssync.comm.clock.clock`, which waits for the device before it reads the time, so a timed
span covers the kernels it launched, not only their launch.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from dssync.comm.clock import clock
from dssync.errors import UsageError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """The device ``name`` (auto, cpu, cuda) means for the rank numbered ``local_rank`` on its host.

    ``local_rank`` defaults to LOCAL_RANK from the environment (0 when unset).
    """
    if name not in DEVICES:
        raise UsageError(f"--device {name!r} is not known; use one of {', '.join(DEVICES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(
            "--device cuda but this machine has no CUDA device (or torch is a CPU build); "
            "use --device cpu or --device auto"
        )
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    count = torch.cuda.device_count()
    return torch.device("cuda", local_rank % count)


def backend_for(device: torch.device, ranks_per_host: int = 1) -> str:
    """nccl for CUDA devices, gloo for the CPU; more ranks on a host than GPUs is refused.

    (nccl refuses two ranks on one GPU, and gloo's point-to-point messages cannot carry CUDA
    tensors: :func:`dssync.comm.devices.check_device`.)
    """
    if device.type != "cuda":
        return "gloo"
    gpus = torch.cuda.device_count()
    if ranks_per_host > gpus:
        raise UsageError(
            f"--device cuda with {ranks_per_host} workers on a host that has {gpus} GPU(s): "
            "nccl needs one GPU per worker and gloo cannot carry CUDA tensors point to point; "
            f"use --workers {gpus} or fewer, or --device cpu"
        )
    return "nccl"


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (a tensor, or a tuple/list/dict of them) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


class Clock:
    """Seconds on ``device``'s clock: waits for the device's queued work before each reading.

    Example::

        clock = Clock(torch.device("cpu"))
        t0 = clock.now()
        ...
        elapsed = clock.now() - t0
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> float:
        return clock(self.device)
