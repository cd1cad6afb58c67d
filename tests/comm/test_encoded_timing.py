"""A compressed average times its transfer as the fp32 one does: from the peers' tags on.

Re-planning compares crossing and local transfer times. Timed only after the data had come, a
compressed crossing of a slow link looked as quick as a local pair, and topology-aware DS-Sync
on an int8 wire re-planned to cross its 200 Mbit/s uplink every step (`dssync bench`, S2,
2026-12-04: 230 ms per iteration against fp32's 149 ms).
"""

from __future__ import annotations

import time

import pytest
import torch

from dssync.comm.averager import Router
from dssync.comm.tags import STEP
from dssync.lab.launch import spawn

SLOW_DATA_S = 0.4


class _SlowWork:
    """A work whose wait takes SLOW_DATA_S longer: its bytes cross a slow link."""

    def __init__(self, work) -> None:
        self.work = work

    def wait(self, *args, **kwargs):
        time.sleep(SLOW_DATA_S)
        return self.work.wait(*args, **kwargs)


def _timed(wire: str, group: list[int]) -> tuple[float, float]:
    import torch.distributed as dist

    batch = dist.batch_isend_irecv

    def slow_data(ops):  # the tags (3 int64) come at once; anything larger is slow
        works = batch(ops)
        return [
            w if op.tensor.numel() <= 3 else _SlowWork(w) for w, op in zip(works, ops, strict=True)
        ]

    router = Router(None, wire=wire)  # of 4 ranks: a smaller group goes point to point
    dist.barrier()
    dist.batch_isend_irecv = slow_data
    if dist.get_rank() not in group:
        return (0.0, 0.0)
    if dist.get_rank() == 1:
        time.sleep(0.5)  # a late partner: rank 0 waits, but that is not transfer
    buf = torch.full((4096,), float(dist.get_rank()))
    t0 = time.perf_counter()
    router.average(group, STEP, 0, buffers=[buf])
    end = time.perf_counter()
    mean = sum(group) / len(group)
    assert torch.allclose(buf, torch.full_like(buf, mean), atol=2e-2)
    return router.arrived - t0, end - router.arrived


@pytest.mark.slow  # spawns 4 ranks three times; CI runs it
@pytest.mark.parametrize(
    ("wire", "group"), [("int8", [0, 1]), ("bf16", [0, 1]), ("int8", [0, 1, 2])]
)
def test_a_compressed_average_counts_its_transfer_and_not_a_late_partner(wire, group):
    waited, moved = spawn(_timed, 4, args=(wire, group), timeout_s=60)[0]
    assert waited > 0.3, waited  # waiting for the late partner ends when its tag comes
    assert moved >= SLOW_DATA_S * 0.9, moved  # the slow data after the tags is transfer
