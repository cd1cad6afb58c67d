"""dssync.checkpoint: DCP checkpoints of sharded (FSDP2) and plain DS-Sync runs, resumed in the
same world (bit-identical) and in another (the documented rule)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dssync import DSSync, Shuffle, checkpoint, nesterov
from dssync.lab.launch import spawn

SETTINGS = {"every": 2, "outer": nesterov(), "wire": "int8", "timeout_s": 60}


def _model(seed: int, mesh=None) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    if mesh is not None:
        fully_shard(m[0], mesh=mesh["shard"])
        fully_shard(m, mesh=mesh["shard"])
    return m


def _run(seed: int, mesh=None, group=None):
    m = _model(seed, mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    sync = DSSync(m, Shuffle(2, seed=1), optimizer=opt, process_group=group, **SETTINGS)
    return m, opt, sync


def _train(m, opt, sync, start: int, stop: int) -> None:
    for step in range(start, stop):
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad()
        sync.step()


def _full(m: nn.Module) -> dict[str, torch.Tensor]:
    opts = StateDictOptions(full_state_dict=True)
    return {k: v.clone() for k, v in get_model_state_dict(m, options=opts).items()}


def _same_world(folder: str):
    """2x2: a run saved at step 3 (mid-window, outer and int8 state held) and resumed, against
    one not interrupted, at step 7; then the same checkpoint loaded as 4 replicas of 1 shard."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    group = mesh.get_group("replicate")
    m, opt, sync = _run(0, mesh, group)
    _train(m, opt, sync, 0, 3)
    checkpoint.save(folder, m, opt, sync)
    saved = _full(m)
    _train(m, opt, sync, 3, 7)
    straight = _full(m)
    m, opt, sync = _run(5, mesh, group)  # another start: what is loaded must replace it
    checkpoint.load(folder, m, opt, sync)
    steps = sync.steps
    _train(m, opt, sync, 3, 7)
    resumed = _full(m)
    m, opt, sync = _run(7)  # 4x1: four plain replicas over the world
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint.load(folder, m, opt, sync)
    four = (_full(m), sync.steps, sync.averagings, [str(w.message) for w in caught])
    _train(m, opt, sync, 3, 5)  # and it trains on
    return saved, straight, resumed, steps, four


def test_a_2x2_run_resumes_bit_identical_and_loads_as_4x1(tmp_path):
    out = spawn(_same_world, 4, args=(str(tmp_path / "ckpt"),), timeout_s=300)
    for rank, (saved, straight, resumed, steps, four) in enumerate(out):
        assert steps == 3
        for k in straight:
            assert torch.equal(resumed[k], straight[k]), k
            assert not torch.equal(straight[k], saved[k])
        # 4 replicas from 2: replica i holds saved replica i mod 2 (ranks 0, 1 are replica 0)
        model, steps4, averagings, messages = four
        source = out[0 if rank % 2 == 0 else 2][0]
        for k in model:
            assert torch.equal(model[k], source[k]), k
        assert (steps4, averagings) == (3, 1)
        assert any("restarts" in m and "4 replicas" not in m for m in messages), messages
    assert any(not torch.equal(out[0][0][k], out[2][0][k]) for k in out[0][0])  # replicas differ


def _two_replicas(folder: str):
    """2x1 (two plain replicas) from the 2x2 checkpoint; then a plain run's own checkpoint
    resumes bit-identical."""
    m, opt, sync = _run(3)
    checkpoint.load(folder, m, opt, sync)
    loaded = _full(m)
    _train(m, opt, sync, 3, 4)
    counts = sync.steps, sync.averagings
    checkpoint.save(folder + "-plain", m, opt, sync)
    _train(m, opt, sync, 4, 7)
    straight = _full(m)
    m, opt, sync = _run(4)
    checkpoint.load(folder + "-plain", m, opt, sync)
    _train(m, opt, sync, 4, 7)
    return loaded, counts, straight, _full(m)


def _save_2x2(folder: str):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    m, opt, sync = _run(0, mesh, mesh.get_group("replicate"))
    _train(m, opt, sync, 0, 3)
    checkpoint.save(folder, m, opt, sync)
    return _full(m)


def test_a_2x2_checkpoint_loads_as_2x1(tmp_path):
    folder = str(tmp_path / "ckpt")
    saved = spawn(_save_2x2, 4, args=(folder,), timeout_s=200)
    out = spawn(_two_replicas, 2, args=(folder,), timeout_s=200)
    for replica, (loaded, counts, straight, resumed) in enumerate(out):
        for k in loaded:  # replica i of the 2x2 run (ranks 2i, 2i+1)
            assert torch.equal(loaded[k], saved[2 * replica][k]), k
            assert torch.equal(resumed[k], straight[k]), k
        assert counts == (4, 2)
    assert any(not torch.equal(out[0][2][k], out[1][2][k]) for k in out[0][2])  # mid-window
