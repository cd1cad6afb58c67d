"""No host reads of tensor data in a steady-state averaging (issue 41, item 3).

On a GPU every read of a device tensor's data on the host (``.item()``, ``.tolist()``, ``.cpu()``,
``.numpy()``, ``bool(t)``, ``int(t)``, ``float(t)``) waits for the device: the CPU can no longer
run ahead of it. These tests run the same code on the CPU and count those calls on every tensor,
in every thread (the overlap lane's worker too), while DS-Sync averages after its warm-up. The
one read an averaging keeps is its verdict's host mirror (:class:`dssync.comm.tags.Verdict`):
a numpy view made once, of memory a non-blocking copy fills, read once that copy is done; it is
no call on a tensor, so it is not counted here.

``device_path=True`` makes the CPU take the path a GPU takes (``reads_free`` says no): the
verdict is applied on the device with ``torch.where`` and read one averaging later. On the CPU's
own path the verdict is read from the tags' few integers (``tolist`` of host memory, no device to
wait for): at most one read per member of the group, and nothing else.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from dssync import DSSync, Shuffle
from dssync.lab.launch import spawn

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def counting(counts: dict[str, int]):
    """Count calls of the host-reading methods of every tensor, in every thread."""
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name, original):
        def counted(self, *args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return original(self, *args, **kwargs)

        return counted

    try:
        for name, original in saved.items():
            setattr(torch.Tensor, name, wrap(name, original))
        yield counts
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


def device_path() -> None:
    """Make this process apply verdicts as on a GPU (on the device, read one averaging later)."""
    import dssync.comm.averager as averager
    import dssync.comm.tags as tags
    import dssync.comm.transport as transport

    tags.reads_free = averager.reads_free = transport.reads_free = lambda device: False


STEPS = 4  # timed steps per case


def _reads(options: dict) -> dict[str, int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sync = DSSync(model, timeout_s=30, **options)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(dist.get_rank()))

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sync.step()

    for _ in range(3):  # warm-up: buffers, residuals, mirrors and groups are made
        step()
    counts: dict[str, int] = {}
    with counting(counts):
        for _ in range(STEPS):
            step()
        if sync.pending:
            sync.finish()  # the last overlapped average merged: its reads count too
    sync.close()
    return counts


CASES = {
    "fp32 pairs": {"schedule": Shuffle(2, seed=1)},
    "groups of 4": {"schedule": Shuffle(4, seed=1)},
    "groups of 3": {"schedule": Shuffle(3, seed=1, uneven=True)},
    "int8 pairs": {"schedule": Shuffle(2, seed=1), "wire": "int8"},
    "int8 groups of 4": {"schedule": Shuffle(4, seed=1), "wire": "int8"},
    "overlap": {"schedule": Shuffle(2, seed=1), "overlap": True},
}


def _every_case(forced: bool) -> dict[str, dict[str, int]]:
    if forced:
        device_path()
    return {name: _reads(options) for name, options in CASES.items()}


@pytest.mark.slow
@pytest.mark.parametrize("forced", [False, True], ids=["cpu path", "device path"])
def test_a_steady_state_averaging_reads_nothing_on_the_host(forced):
    for rank, found in enumerate(spawn(_every_case, 4, args=(forced,), timeout_s=300)):
        for name, counts in found.items():
            if forced:
                assert counts == {}, f"{name}: rank {rank} read tensor data on the host: {counts}"
            else:  # the CPU reads its tags' integers: one per member (4 ranks), none of the data
                assert set(counts) <= {"tolist"}, f"{name}: rank {rank} read {counts}"
                assert counts.get("tolist", 0) <= 4 * STEPS, f"{name}: rank {rank}: {counts}"
