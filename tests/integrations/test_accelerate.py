"""DSSyncLocal in an Accelerate loop on 2 CPU processes: local gradients, group averages, one model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator, DistributedType
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dssync import Schedule
from dssync.accelerate import DSSyncLocal
from dssync.errors import UsageError
from dssync.lab.launch import spawn

STEPS = 5  # optimizer steps, each over 2 accumulated batches


class Alternate(Schedule):
    """Even steps: every rank alone (no averaging); odd steps: all ranks in one group."""

    def partition(self, step: int, world_size: int) -> list[list[int]]:
        if step % 2 == 0:
            return [[r] for r in range(world_size)]
        return [list(range(world_size))]


def _train(every: int = 1):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2 * 2 * 4 * STEPS, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    grads, weights = [], []
    with DSSyncLocal(accelerator, model, Alternate(), optimizer=optimizer, every=every) as ds:
        for xb, yb in loader:
            with accelerator.accumulate(model):
                accelerator.backward(F.mse_loss(model(xb), yb))
                if accelerator.sync_gradients:
                    grads.append(model.module.weight.grad.detach().clone())
                optimizer.step()
                optimizer.zero_grad()
                ds.step()
                if accelerator.sync_gradients:
                    weights.append(model.module.weight.detach().clone())
        last = model.module.weight.detach().clone()
    momentum = optimizer.optimizer.state[model.module.weight]["momentum_buffer"]
    return grads, weights, last, model.module.weight.detach(), momentum.clone(), ds.steps


def test_sharded_and_wrong_schedule_are_refused():
    fsdp = SimpleNamespace(distributed_type=DistributedType.FSDP, num_processes=2)
    with pytest.raises(UsageError, match="plain data parallelism"):
        DSSyncLocal(fsdp, nn.Linear(2, 2))
    single = SimpleNamespace(distributed_type=DistributedType.NO, num_processes=1)
    with pytest.raises(UsageError, match="dssync.Shuffle"):
        DSSyncLocal(single, nn.Linear(2, 2), "pairs")


@pytest.mark.timeout(240)
def test_local_gradients_group_averages_identical_on_exit():
    r0, r1 = spawn(_train, 2, timeout_s=200)
    (g0, w0, last0, end0, m0, steps0), (g1, w1, last1, end1, m1, steps1) = r0, r1
    assert steps0 == steps1 == STEPS == len(w0)  # accumulation micro-batches do not count
    for step in range(STEPS):
        assert not torch.equal(g0[step], g1[step]), f"step {step}: DDP all-reduced the gradients"
        paired = step % 2 == 1
        assert torch.equal(w0[step], w1[step]) == paired, f"step {step}: paired={paired}"
    assert not torch.equal(last0, last1)  # the last step trained alone ...
    assert torch.equal(end0, end1) and torch.equal(m0, m1)  # ... and leaving the block averaged
    assert torch.allclose(end0, (last0 + last1) / 2)


@pytest.mark.timeout(240)
def test_every_reaches_dssync():
    """Averaging every 2nd step: Alternate's averaging 1 (all ranks) comes at step 4."""
    (_, w0, *_), (_, w1, *_) = spawn(_train, 2, args=(2,), timeout_s=200)
    together = [torch.equal(a, b) for a, b in zip(w0, w1, strict=True)]
    assert together == [False, False, False, True, False]


def _refuse_sharded() -> str | None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = nn.Linear(4, 2)
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))  # FSDP2 by hand, Accelerate unaware
    multi = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, num_processes=2)
    try:
        DSSyncLocal(multi, model)
    except UsageError as exc:
        return str(exc)
    return None


@pytest.mark.timeout(120)
def test_a_model_sharded_with_fully_shard_is_refused_naming_dssync_across_replicas():
    for message in spawn(_refuse_sharded, 2, timeout_s=100):
        assert message is not None, "DSSyncLocal took a sharded model"
        assert "DSSyncLocal does not support a sharded (DTensor, FSDP2) model" in message
        assert "process_group=mesh.get_group('replicate')" in message
