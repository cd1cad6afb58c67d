"""Which device a rank's averaging runs on, and the pairs of backend and device that cannot work.

nccl moves tensors of the process's current CUDA device only and refuses two ranks on one GPU;
gloo's point-to-point send and receive hand a tensor's pointer to a TCP socket, so a CUDA tensor
cannot go through them. :func:`check_device` refuses both mistakes when a ``DSSync`` (or any
:class:`~dssync.comm.averager.Router`) is built, before the first message, with the fix.
:func:`local_device` is the one-GPU-per-rank default: the GPU numbered by ``LOCAL_RANK``.

Example::

    torch.cuda.set_device(local_device())          # before init_process_group("nccl")
    check_device("nccl", torch.device("cuda", 0))   # passes where cuda:0 is the current device
"""

from __future__ import annotations

import os

import torch

from dssync.errors import UsageError

ONE_GPU_PER_RANK = (
    "call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before "
    "init_process_group('nccl') and move the model to that device"
)


def local_device() -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` (modulo the GPUs it sees) where every rank of the
    host (``LOCAL_WORLD_SIZE``, as torchrun sets it) has a GPU of its own, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if int(os.environ.get("LOCAL_WORLD_SIZE", 1)) > gpus and not visible:
        return torch.device("cpu")  # nccl refuses two ranks on one GPU
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % gpus)


def check_device(backend: str, device: torch.device | None, current: int | None = None) -> None:
    """Refuse a backend and a device that cannot average together, naming the fix.

    ``backend`` is the process group's (``dist.get_backend``); ``device`` where the buffers live
    (None: nothing to average); ``current`` the current CUDA device's index (read from torch
    when None and CUDA is present).
    """
    if device is None:
        return
    backend = str(backend).lower()
    if backend == "gloo" and device.type == "cuda":
        raise UsageError(
            f"the model is on {device} but the process group is gloo, whose point-to-point "
            "messages cannot carry CUDA tensors: use init_process_group('nccl') with one GPU per "
            f"rank ({ONE_GPU_PER_RANK}), or keep the model on the CPU with gloo"
        )
    if backend != "nccl":
        return
    if device.type != "cuda":
        raise UsageError(
            f"the process group is nccl but the model is on {device}: nccl moves CUDA tensors "
            f"only; {ONE_GPU_PER_RANK}, or use init_process_group('gloo') for a CPU model"
        )
    if current is None and torch.cuda.is_available():
        current = torch.cuda.current_device()
    index = 0 if device.index is None else device.index
    if current is not None and index != current:
        raise UsageError(
            f"the model is on cuda:{index} but this process's current CUDA device is "
            f"cuda:{current}, where nccl communicates (two ranks on one GPU are refused by "
            f"nccl): {ONE_GPU_PER_RANK}"
        )
