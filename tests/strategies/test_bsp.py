"""BSP: DDP's gradients are the mean over ranks, and its timing hook reports a bounded sync time."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync.lab.baselines.bsp import BSP, _seconds, covered
from dssync.lab.launch import spawn

WORLD = 2
STEPS = 3


def _run() -> list[tuple[float, float, float]]:
    """Per step: sync time, the step's wall time, and the largest gradient error against the mean."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    # two buckets (tiny bucket cap), so the hook's spans are merged across buckets
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))
    reference = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))
    reference.load_state_dict(model.state_dict())
    strategy = BSP(model, bucket_cap_mb=0.004)
    out = []
    for step in range(STEPS):
        torch.manual_seed(100 * step + rank)  # each rank its own batch
        x, y = torch.randn(8, 32), torch.randn(8, 4)
        reference.zero_grad()
        nn.functional.mse_loss(reference(x), y).backward()
        local = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        everyone = [torch.zeros_like(local) for _ in range(WORLD)]
        dist.all_gather(everyone, local)
        model.zero_grad()
        strategy.take_sync_time()
        t0 = time.perf_counter()
        nn.functional.mse_loss(strategy.model(x), y).backward()
        wall = time.perf_counter() - t0
        synced = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        error = float((synced - sum(everyone) / WORLD).abs().max())
        out.append((strategy.take_sync_time(), wall, error))
    return out


def test_gradients_are_the_mean_and_sync_time_is_bounded_by_the_step():
    for rank, steps in enumerate(spawn(_run, WORLD, timeout_s=120)):
        for sync, wall, error in steps:
            assert error < 1e-6, (rank, error)
            assert 0.0 < sync <= wall, (rank, sync, wall)


def test_covered_merges_overlapping_spans():
    assert covered([]) == 0.0
    assert covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == pytest.approx(4.0)
    assert covered([(1.0, 4.0), (2.0, 3.0)]) == pytest.approx(3.0)  # one inside another


class _Event:
    """Stands in for a CUDA event: a time in seconds, and whether it was waited for."""

    def __init__(self, t: float) -> None:
        self.t, self.waited = t, False

    def synchronize(self) -> None:
        self.waited = True

    def elapsed_time(self, other: _Event) -> float:
        return (other.t - self.t) * 1e3  # milliseconds, as torch.cuda.Event


def test_cuda_spans_are_waited_for_and_merged_on_one_axis():
    spans = [(_Event(1.0), _Event(1.5)), (_Event(1.2), _Event(2.0)), (_Event(3.0), _Event(3.25))]
    assert covered(_seconds(spans)) == pytest.approx(1.25)
    assert all(end.waited for _, end in spans)


def _replicas_after_steps() -> dict[str, float]:
    from dssync.lab.train.summary import averaged_copy

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 3))
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    strategy = BSP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(5):
        torch.manual_seed(10 * step + rank)  # each rank its own batch
        x, y = torch.randn(8, 16), torch.randn(8, 3)
        opt.zero_grad()
        nn.functional.mse_loss(strategy.model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(everyone, flat)
    whole = averaged_copy(model).state_dict()
    buffers_only = averaged_copy(model, parameters=False).state_dict()  # what eval_record uses
    return {
        "across ranks": max(float((e - flat).abs().max()) for e in everyone),
        "moved": float((flat - start).abs().max()),
        "skipping the parameters": max(
            float((whole[k].double() - buffers_only[k].double()).abs().max()) for k in whole
        ),
    }


def test_ddp_replicas_stay_bitwise_equal_so_an_evaluation_need_not_average_them():
    # what BSP.replicas_equal claims, and eval_record relies on to skip the parameter average
    assert BSP.replicas_equal
    for r in spawn(_replicas_after_steps, WORLD, timeout_s=120):
        assert r["across ranks"] == 0.0 and r["moved"] > 0.01, r
        assert r["skipping the parameters"] < 1e-6, r  # the same model to evaluate, buffers too
