"""The baselines: fp16 and PowerSGD DDP hooks, D-PSGD on a ring, and `dssync train` through them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync.errors import PeerLost
from dssync.lab.baselines import DPSGD, FP16, PowerSGD
from dssync.lab.config import TrainConfig
from dssync.lab.launch import WorkerError, spawn
from dssync.lab.methods import build_strategy
from dssync.schedules import ring_matrix
from dssync.strategies import DSSync

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from cli_run import DIGITS, load, run  # noqa: E402  (the CLI in a subprocess that cannot outlive us)


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    everyone = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t.contiguous())
    return everyone


def _flat(module: nn.Module, grad: bool = False) -> torch.Tensor:
    return torch.cat([(p.grad if grad else p.detach()).reshape(-1) for p in module.parameters()])


def _grad_errors(strategy, model: nn.Module, steps: int, batch: int) -> list[float]:
    """Per step: largest |synced gradient - mean of the ranks' gradients| / largest |mean|.

    Each rank's own gradient comes from a copy of the model; the optimizer steps the real one.
    """
    rank = dist.get_rank()
    reference = nn.Linear(16, 8, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    errors = []
    for step in range(steps):
        torch.manual_seed(1000 * step + rank)  # each rank its own batch
        x, y = torch.randn(batch, 16), torch.randn(batch, 8)
        reference.load_state_dict(model.state_dict())
        reference.zero_grad()
        nn.functional.mse_loss(reference(x), y).backward()
        mean = sum(_gather(_flat(reference, grad=True))) / dist.get_world_size()
        opt.zero_grad()
        nn.functional.mse_loss(strategy.model(x), y).backward()
        errors.append(float((_flat(model, grad=True) - mean).abs().max() / mean.abs().max()))
        opt.step()
    return errors


def _compressed() -> dict[str, object]:
    out: dict[str, object] = {}
    torch.manual_seed(0)
    model = nn.Linear(16, 8, bias=False)
    fp16 = FP16(model)
    out["fp16"] = _grad_errors(fp16, model, steps=3, batch=8)
    out["fp16 sync"] = fp16.take_sync_time()
    out["fp16 same"] = [float((p - _flat(model)).abs().max()) for p in _gather(_flat(model))]
    # one sample per rank: the mean gradient of the 8x16 weight has rank <= 2, so rank-2
    # PowerSGD recovers it (one power iteration spans its columns) and rank 1 cannot
    for r in (1, 2):
        torch.manual_seed(0)
        model = nn.Linear(16, 8, bias=False)
        powersgd = PowerSGD(model, rank=r, start_iter=2)
        out[f"powersgd {r}"] = _grad_errors(powersgd, model, steps=6, batch=1)
        out[f"powersgd {r} sync"] = powersgd.take_sync_time()
        out[f"powersgd {r} iter"] = powersgd.state_dict()["iter"]
    return out


def test_fp16_and_powersgd_gradients_are_the_mean_up_to_their_compression():
    results = spawn(_compressed, 2, timeout_s=180)
    for r in results:
        assert all(0 < e < 2e-3 for e in r["fp16"]), r["fp16"]  # half precision, and not exact
        assert r["fp16 sync"] > 0 and r["fp16 same"] == [0.0, 0.0]
        for k in (1, 2):  # two plain all-reduce steps, then compression
            assert max(r[f"powersgd {k}"][:2]) < 1e-6, r[f"powersgd {k}"]
            assert r[f"powersgd {k} sync"] > 0 and r[f"powersgd {k} iter"] == 6
        assert max(r["powersgd 2"][2:]) < 1e-3, r["powersgd 2"]
        assert min(r["powersgd 1"][2:]) > 0.05, r["powersgd 1"]


def _powersgd_training() -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 4))
    teacher = nn.Linear(20, 4)
    strategy = PowerSGD(model, rank=2, start_iter=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1 + dist.get_rank())
    losses = []
    for _ in range(60):
        x = torch.randn(16, 20)
        loss = nn.functional.mse_loss(strategy.model(x), teacher(x).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    drift = [float((p - _flat(model)).abs().max()) for p in _gather(_flat(model))]
    return losses, drift


def test_powersgd_training_reduces_the_loss_and_keeps_ranks_identical():
    for losses, drift in spawn(_powersgd_training, 2, timeout_s=180):
        assert np.mean(losses[-10:]) < 0.3 * np.mean(losses[:5]), losses
        assert drift == [0.0, 0.0]


def _ring() -> dict[str, object]:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5))
    strategy = DPSGD(model, bucket_bytes=64)  # several buckets, several messages per neighbour
    strategy.time_sync()
    with torch.no_grad():  # rank-specific parameters and buffers, written into the buckets
        for t in strategy._buckets.tensors:
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(rank)))
    start = torch.stack(_gather(torch.cat([b for b in strategy._buckets.buffers])))
    strategy.after_step()
    once = torch.stack(_gather(torch.cat([b for b in strategy._buckets.buffers])))
    for _ in range(40):
        strategy.after_step()
    later = torch.stack(_gather(torch.cat([b for b in strategy._buckets.buffers])))
    sync = strategy.take_sync_time()
    strategy.average_all()
    final = torch.cat([b for b in strategy._buckets.buffers])
    return {
        "buckets": len(strategy._buckets.buffers),
        "start": start,
        "once": once,
        "later": later,
        "final": final,
        "sync": sync,
        "group": strategy.current_group(),
    }


@pytest.mark.parametrize("world", [3, 4])
def test_dpsgd_step_applies_the_ring_matrix_and_repeats_to_the_mean(world):
    results = spawn(_ring, world, timeout_s=180)
    r0 = results[0]
    assert r0["buckets"] > 2
    start = r0["start"].double().numpy()
    mean = start.mean(axis=0)
    assert np.abs(start - mean).max() > 0.5  # the ranks really started apart
    np.testing.assert_allclose(r0["once"].numpy(), ring_matrix(world) @ start, atol=1e-5)
    np.testing.assert_allclose(r0["later"].numpy(), np.tile(mean, (world, 1)), atol=1e-4)
    for rank, r in enumerate(results):
        np.testing.assert_allclose(r["final"].numpy(), mean, atol=1e-4)
        assert r["sync"] > 0
        assert r["group"] == sorted({(rank - 1) % world, rank, (rank + 1) % world})


def _silent_neighbour() -> str:
    torch.manual_seed(0)
    ring = dist.new_group()  # a timeout closes the ring's connections; the default group lives on
    strategy = DPSGD(nn.Linear(4, 2), process_group=ring, timeout_s=3)
    if dist.get_rank() == 2:
        return "silent"
    try:
        strategy.after_step()
    except PeerLost as e:
        return str(e)
    return "no error"


def test_dpsgd_names_the_neighbours_when_one_never_answers():
    results = spawn(_silent_neighbour, 3, timeout_s=120)
    for rank in (0, 1):
        assert f"rank {rank} got no parameters from its ring neighbours" in results[rank]
        # the one bounded wait's message: the silent neighbour and the timeout, by argument name
        assert "rank 2 never came" in results[rank] and "timeout_s=3" in results[rank]


def _exp_gossip() -> list[torch.Tensor]:
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = build_strategy(TrainConfig(sync="exp-gossip", timeout_s=30), model, opt)
    assert isinstance(strategy, DSSync)
    with torch.no_grad():  # rank-specific parameters
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(dist.get_rank())))
    seen = [torch.stack(_gather(_flat(model)))]
    for _ in range(2):  # log2(4) rounds
        strategy.after_step()
        seen.append(torch.stack(_gather(_flat(model))))
    return seen


def test_exp_gossip_through_the_registry_averages_four_ranks_exactly_in_two_steps():
    start, pairs, done = spawn(_exp_gossip, 4, timeout_s=180)[0]
    mean = start.mean(dim=0)
    assert (start - mean).abs().max() > 0.5
    for a, b in ([0, 1], [2, 3]):  # step 0: partners differ in the lowest bit
        torch.testing.assert_close(pairs[a], (start[a] + start[b]) / 2)
        torch.testing.assert_close(pairs[b], pairs[a])
    assert (pairs - mean).abs().max() > 0.1
    torch.testing.assert_close(done, mean.expand_as(done), rtol=0, atol=1e-6)


def test_exp_gossip_on_three_ranks_is_a_usage_error_naming_the_sizes_that_work():
    with pytest.raises(WorkerError) as info:
        spawn(_exp_gossip, 3, timeout_s=120)
    assert info.value.exc_type == "UsageError"
    assert "power-of-2 number of workers (1, 2, 4, 8, 16, ...), got 3" in info.value.message
    assert "use 2 or 4 workers" in info.value.message


@pytest.mark.timeout(400)
@pytest.mark.parametrize("method", ["dpsgd", "powersgd", "dssync-async"])
def test_train_runs_a_baseline_through_the_registry(tmp_path, method):
    out = tmp_path / "run.json"
    r = run(["train", *DIGITS, "--sync", method, "--json", str(out)], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    data = load(out)
    assert 0.5 < data["final_accuracy"] <= 1
    assert data["sync_time_s"] > 0


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("args", "options"),
    [
        (["--sync", "diloco"], {"every": 4, "outer": "auto", "overlap": False, "replan": 0}),
        (["--sync", "dssync", "--every", "2", "--overlap"], {"every": 2, "overlap": True}),
    ],
)
def test_train_runs_a_baseline_through_the_registry_with_options(tmp_path, args, options):
    """(Named so that conftest's slow list covers it.) The summary records the options used."""
    out = tmp_path / "run.json"
    r = run(["train", *DIGITS, *args, "--json", str(out)], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    data = load(out)
    assert 0.5 < data["final_accuracy"] <= 1
    assert {k: data["config"][k] for k in options} == options
