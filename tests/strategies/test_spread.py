"""Topology-aware DS-Sync with spread crossings: each crossing averages one slice of the model,
the rest stays put, and the ranks still reach one model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dssync.comm.averager import Router
from dssync.comm.tags import STEP
from dssync.lab.launch import spawn
from dssync.schedules.topology import TopologyAware
from dssync.strategies.dssync import DSSync


def _slice_average() -> list[float]:
    import torch.distributed as dist

    rank = dist.get_rank()
    buf = torch.full((10,), float(rank))
    Router(None).average([0, 1], STEP, 0, buffers=[buf], part=(1, 4))  # elements 2, 3, 4
    return buf.tolist()


def test_router_averages_only_the_given_slice():
    out = spawn(_slice_average, 2, timeout_s=60)
    for rank, buf in enumerate(out):
        assert buf[2:5] == [0.5] * 3
        assert buf[:2] + buf[5:] == [float(rank)] * 7


def _train(steps: int) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(64, 1)
    # Rack 1 is one rank: it crosses every step, a slice at a time, with rack 0's ranks in turn.
    schedule = TopologyAware([[0, 1, 2], [3]], cross_every=4, spread=True)
    sync = DSSync(model, schedule=schedule)
    with torch.no_grad():  # rack 0 holds 0, rack 1 holds 1: only crossings mix them
        for p in model.parameters():
            p.fill_(float(rank == 3))
    spread = []
    for _ in range(steps):
        sync.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        spread.append(flat.clone())
    sync.average_all()
    final = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"flat": [f.tolist() for f in spread], "final": final.tolist()}


def test_spread_crossings_mix_every_slice_and_keep_the_mean():
    out = spawn(_train, 4, args=(24,), timeout_s=120)
    n = len(out[0]["final"])
    for t in range(24):
        rows = torch.tensor([o["flat"][t] for o in out])
        assert torch.allclose(rows.mean(0), torch.full((n,), 0.25), atol=1e-6)  # mean kept
    first = torch.tensor([o["flat"][0] for o in out])
    assert (first[3] == 0.5).sum() == n // 4  # step 0: one slice of four crossed, at 1/2
    assert (first[3] == 1.0).sum() == n - n // 4  # the rest stayed as it was
    after_one_cycle = torch.tensor([o["flat"][3] for o in out])
    assert (after_one_cycle[3] < 1.0).all()  # after 4 steps every slice has crossed once
    last = torch.tensor([o["flat"][-1] for o in out])
    assert (last.max(0).values - last.min(0).values).max() < 0.1  # converging
    assert all(o["final"] == out[0]["final"] for o in out)  # average_all: one model


def _late_partner() -> tuple[float, float]:
    import time

    import torch.distributed as dist

    router = Router(None)  # of 3 ranks: the pair [0, 1] goes point to point
    buf = torch.zeros(1000)
    if dist.get_rank() == 2:
        return (0.0, 0.0)
    if dist.get_rank() == 1:
        time.sleep(0.5)  # a late partner: rank 0 waits, but that is not transfer
    t0 = time.perf_counter()
    router.average([0, 1], STEP, 0, buffers=[buf])
    end = time.perf_counter()
    return router.arrived - t0, end - router.arrived


@pytest.mark.slow  # the quick tier keeps under 6 minutes; CI runs it
def test_arrival_splits_waiting_for_a_late_partner_from_transfer():
    out = spawn(_late_partner, 3, timeout_s=60)
    waited, moved = out[0]
    assert waited > 0.3  # rank 0's wait for rank 1 ends when its tag arrives
    assert moved < 0.2  # the 4 KB that follow are quick


def _different_slices(out_dir: str) -> None:
    import os
    import time
    from pathlib import Path

    import torch.distributed as dist

    from dssync.errors import SyncError

    rank = dist.get_rank()
    router = Router(None)  # of 3 ranks: the pair [0, 1] goes point to point
    if rank == 2:
        return
    buf = torch.full((8,), float(rank))
    try:  # slices of equal size, but not the same elements: must not mix silently
        router.average([0, 1], STEP, 0, buffers=[buf], part=(1 + rank, 4))
        result = f"mixed {buf.tolist()}"
    except SyncError as e:
        result = f"refused: {e}"
    Path(out_dir, str(rank)).write_text(result)
    # A refused exchange leaves its chunks posted: leave, as a failed run does, once both wrote
    # (a failed rank's exit makes spawn kill the rest).
    end = time.monotonic() + 30
    while time.monotonic() < end and len(list(Path(out_dir).iterdir())) < 2:
        time.sleep(0.05)
    os._exit(3)


def test_ranks_on_different_slices_are_refused(tmp_path):
    from dssync.lab.launch import WorkerError

    with pytest.raises(WorkerError):
        spawn(_different_slices, 3, args=(str(tmp_path),), timeout_s=60)
    out = [(tmp_path / str(r)).read_text() for r in (0, 1)]
    assert out[0].startswith("refused") and out[1].startswith("refused"), out
    assert "bucket layout" in out[0]


def _blocking_and_overlapped(steps: int) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    out = {}
    for name in ("blocking", "overlap"):
        torch.manual_seed(0)
        model = nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(4, 16)).sum().backward()
        opt.step()  # momentum buffers exist, and are averaged with the parameters
        schedule = TopologyAware([[0, 1, 2], [3]], cross_every=4, spread=True)
        sync = DSSync(model, schedule=schedule, optimizer=opt, overlap=name == "overlap")
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(rank == 3))
        rows = []
        for _ in range(steps):
            sync.step()  # no local update between steps
            rows.append(torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
        out[name] = rows
        if name == "overlap":
            sync.close()
    return out


@pytest.mark.slow  # the quick tier keeps under 6 minutes; CI runs it
def test_overlapped_slices_give_the_blocking_bits_one_step_later():
    out = spawn(_blocking_and_overlapped, 4, args=(9,), timeout_s=120)
    for rank_out in out:
        blocking, overlap = rank_out["blocking"], rank_out["overlap"]
        assert blocking[0] != blocking[1]  # the slices moved something
        for t in range(8):  # with no local update, overlap merges step t's average at t + 1
            assert overlap[t + 1] == blocking[t]
