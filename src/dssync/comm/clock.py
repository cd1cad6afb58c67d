"""Reading the clock around device work: wait for the device first, or the timer sees only the launch.

CUDA runs kernels (and nccl collectives) asynchronously: a host timer read right after a call
returns measures the time to queue the work, not to do it. :func:`clock` waits for the device's
queued work (``torch.cuda.synchronize``) before reading ``time.perf_counter``; on the CPU it reads
the clock straight away.

Example::

    t0 = clock(device)
    dist.all_reduce(bucket, group=pg)
    spent = clock(device) - t0          # includes the transfer on a GPU too
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Block until ``device`` has finished the work queued on it so far (nothing on the CPU)."""
    if device is None:
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, device.type):
        backend = getattr(torch, device.type)  # torch.xpu, torch.mps, ... share the interface
        if hasattr(backend, "synchronize"):
            backend.synchronize()


def clock(device: torch.device | str | None = None) -> float:
    """``time.perf_counter()`` after ``device`` has finished its queued work."""
    synchronize(device)
    return time.perf_counter()


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter (or buffer); the CPU for an empty module."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return torch.device("cpu")
