"""The device clock waits for the device before reading the time; the CPU needs no wait."""

from __future__ import annotations

import torch
from torch import nn

from dssync.comm.clock import clock, module_device, synchronize


def test_cuda_is_synchronized_before_the_clock_is_read(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    t0 = clock("cuda:0")
    assert calls == [torch.device("cuda:0")] and clock("cuda:0") >= t0
    synchronize("cpu")
    synchronize(None)
    clock()
    assert len(calls) == 2  # the CPU and "no device" never wait


def test_module_device():
    assert module_device(nn.Linear(2, 2)) == torch.device("cpu")
    assert module_device(nn.Sequential()) == torch.device("cpu")
