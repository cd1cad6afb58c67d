"""DS-Sync across the replicas of an FSDP2-sharded model (CPU, gloo, 2x2 and 4x2 meshes)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dssync import AsyncDSSync, DSSync, Global, Shuffle, consensus_distance, nesterov
from dssync.errors import UsageError
from dssync.lab.launch import spawn

LR = 0.1


def _mesh(replicas: int, shards: int):
    return init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))


def _model(mesh, hsdp: bool = False, root: bool = True) -> nn.Module:
    """The same tiny model on every rank, sharded: 5 rows of 2 and 3 over 2 shards, 1 row of
    1 and 0 (a rank with an empty local shard)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 1))
    where = mesh if hsdp else mesh["shard"]
    fully_shard(m[0], mesh=where)
    if root:
        fully_shard(m, mesh=where)
    return m


def _train(m: nn.Module, opt, sync, steps: int, start: int = 0) -> None:
    """Each global rank trains on its own batches (as data parallelism over all ranks does)."""
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad()
        if sync is not None:
            sync.step()


def _full(m: nn.Module) -> dict[str, torch.Tensor]:
    opts = StateDictOptions(full_state_dict=True)
    return {k: v.clone() for k, v in get_model_state_dict(m, options=opts).items()}


def _parity(mesh):
    """DS-Sync with Global() every step (momentum averaged) against FSDP2's HSDP."""
    m = _model(mesh)
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9)
    sync = DSSync(
        m, Global(), optimizer=opt, process_group=mesh.get_group("replicate"), timeout_s=60
    )
    _train(m, opt, sync, 4)
    ours = _full(m)
    h = _model(mesh, hsdp=True)
    hopt = torch.optim.SGD(h.parameters(), lr=LR, momentum=0.9)
    _train(h, hopt, None, 4)
    return ours, _full(h), _full(_model(mesh))


def _check_parity(out) -> None:
    start = out[0][2]
    for ours, hsdp, _ in out:
        assert ours.keys() == hsdp.keys()
        for k in ours:
            assert not torch.equal(ours[k], start[k])  # it trained
            torch.testing.assert_close(ours[k], hsdp[k], rtol=1e-5, atol=1e-6)
            assert torch.equal(ours[k], out[0][0][k])  # every replica holds the same bits


def _on_mesh(fn, replicas: int, shards: int, *args):
    return fn(_mesh(replicas, shards), *args)


OPTIONS = {
    "every": ({"every": 3}, "sgd"),
    "int8-fragments": ({"every": 2, "wire": "int8", "fragments": 2}, "sgd"),
    "bf16-adam": ({"every": 2, "wire": "bf16"}, "adam"),  # average_grads, sharded gradients
}
REFUSALS = {
    "mixed": ["mixes sharded (DTensor) parameters with plain ones (2.weight", "root"],
    "hsdp": ["in DSSync's process group", "mesh=mesh['shard']"],
    "overlap": ["overlap=True with a sharded model", "overlap=False"],
    "async": ["AsyncDSSync does not support a sharded", "DSSync across replicas"],
}


def _consensus(mesh):
    """consensus_distance of a sharded model over its replicas, and the full models' own."""
    group = mesh.get_group("replicate")
    m = _model(mesh)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    sync = DSSync(m, Global(), every=4, process_group=group, timeout_s=60)
    _train(m, opt, sync, 2)  # two local steps on each rank's own batches: the replicas apart
    apart = consensus_distance(m, process_group=group)
    full = torch.cat([p.full_tensor().detach().reshape(-1).double() for p in m.parameters()])
    mean = full.clone()
    dist.all_reduce(mean, group=group)
    mean /= 2
    d = torch.tensor([float(((full - mean) ** 2).sum())], dtype=torch.float64)
    dist.all_reduce(d, group=group)
    expected = float(d) / 2 / float((mean**2).sum())
    sync.average_all()
    return apart, expected, consensus_distance(m, process_group=group)


def _join(mesh):
    """Replica 1 runs out of data after 3 steps, replica 0 trains 5; under torch's Join the
    ranks of replica 1 keep taking their part in each averaging."""
    from torch.distributed.algorithms.join import Join

    group = mesh.get_group("replicate")
    m = _model(mesh)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    sync = DSSync(m, Global(), process_group=group, timeout_s=60)
    steps = 5 if mesh["replicate"].get_local_rank() == 0 else 3
    with Join([sync]):
        _train(m, opt, sync, steps)
    return sync.steps, _full(m)


def _quick_2x2():
    """Every quick case in one world of 4 ranks (starting processes is the slow part)."""
    mesh = _mesh(2, 2)
    return {
        "parity": _parity(mesh),
        **{name: _pairs_then_all(mesh, *case) for name, case in OPTIONS.items()},
        "outer": _outer(mesh),
        "consensus": _consensus(mesh),
        "join": _join(mesh),
        **{f"refused-{case}": _refused(mesh, case) for case in REFUSALS},
    }


@pytest.fixture(scope="module")
def quick() -> list[dict]:
    return spawn(_quick_2x2, 4, timeout_s=300)


def test_global_every_step_matches_hsdp_on_2x2(quick):
    _check_parity([r["parity"] for r in quick])


def test_consensus_distance_measures_the_replicas_full_models_on_2x2(quick):
    for apart, expected, after in (r["consensus"] for r in quick):
        assert apart > 0  # two local steps on different batches
        assert apart == pytest.approx(expected, rel=1e-9)  # the full models', not one shard's
        assert after == 0.0  # average_all(): one model on every replica


def test_a_replica_out_of_data_serves_the_averagings_under_join_on_2x2(quick):
    # replica 1 trained 3 steps, replica 0 five: without Join replica 0's 4th averaging would
    # wait for a partner that never comes
    steps = [r["join"][0] for r in quick]
    assert steps == [5, 5, 5, 5]
    models = [r["join"][1] for r in quick]
    for m in models[1:]:
        assert all(torch.equal(m[k], models[0][k]) for k in m)


@pytest.mark.slow
def test_global_every_step_matches_hsdp_on_4x2():
    _check_parity(spawn(_on_mesh, 8, args=(_parity, 4, 2), timeout_s=300))


def _pairs_then_all(mesh, settings: dict, optimizer: str):
    """Pairs (or options) leave replicas apart; average_all() makes one full model."""
    m = _model(mesh)
    params = list(m.parameters())
    opt = (
        torch.optim.Adam(params, lr=0.01)
        if optimizer == "adam"
        else torch.optim.SGD(params, lr=LR, momentum=0.9)
    )
    sync = DSSync(
        m,
        Shuffle(2, seed=1),
        optimizer=opt,
        process_group=mesh.get_group("replicate"),
        timeout_s=60,
        **settings,
    )
    _train(m, opt, sync, 5)
    before = _full(m)
    sync.average_all()
    after = _full(m)
    moments = [s for s in opt.state.values()]
    sync.close()
    first = "momentum_buffer" if optimizer == "sgd" else "exp_avg"
    return before, after, [s[first].full_tensor() for s in moments]


def _check_pairs(out, replicas: int, shards: int) -> None:
    by_replica = [out[r * shards] for r in range(replicas)]
    keys = list(by_replica[0][0])
    # after 5 steps (every=2 or 3, or pairs among 4 replicas) not every replica is the same
    assert any(not torch.equal(b[0][k], by_replica[0][0][k]) for b in by_replica[1:] for k in keys)
    for _, after, moments in out:  # every rank: the same full model and moments
        for k in keys:
            assert torch.equal(after[k], out[0][1][k])
        for a, b in zip(moments, out[0][2], strict=True):
            assert torch.equal(a, b)
    for k in keys:  # the global average is the mean of the replicas' models (fp32 wire)
        mean = torch.stack([b[0][k] for b in by_replica]).mean(0)
        torch.testing.assert_close(out[0][1][k], mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_options_compose_and_average_all_gives_one_model_on_2x2(quick, name):
    out = [r[name] for r in quick]
    if OPTIONS[name][0].get("wire", "fp32") == "fp32":
        _check_pairs(out, 2, 2)
    else:  # residuals come back in average_all: still one model on every rank
        for _, after, moments in out:
            for k in after:
                assert torch.equal(after[k], out[0][1][k])
            for a, b in zip(moments, out[0][2], strict=True):
                assert torch.equal(a, b)


@pytest.mark.slow
def test_pairs_among_four_replicas_then_average_all_on_4x2():
    out = spawn(_on_mesh, 8, args=(_pairs_then_all, 4, 2, {}, "sgd"), timeout_s=300)
    _check_pairs(out, 4, 2)


def _outer(mesh):
    """DiLoCo across replicas: after each averaging (Global) every replica holds the anchor."""
    m = _model(mesh)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    sync = DSSync(
        m,
        Global(),
        process_group=mesh.get_group("replicate"),
        every=2,
        outer=nesterov(),
        timeout_s=60,
    )
    start = _full(m)
    _train(m, opt, sync, 3)  # averaged at step 2, one local step after
    mid = _full(m)
    _train(m, opt, sync, 1, start=3)
    return start, mid, _full(m)


def test_outer_anchors_are_sharded_and_agree_across_replicas_on_2x2(quick):
    out = [r["outer"] for r in quick]
    for start, _mid, end in out:
        for k in end:
            assert torch.equal(end[k], out[0][2][k])  # after the second averaging: one model
            assert not torch.equal(end[k], start[k])
    assert any(not torch.equal(out[0][1][k], out[2][1][k]) for k in out[0][1])  # local step


def _refused(mesh, case: str) -> str:
    settings = {}
    if case == "mixed":
        m = _model(mesh, root=False)  # the last Linear stays plain
    elif case == "hsdp":
        m = _model(mesh, hsdp=True)  # FSDP2 already all-reduces across replicas
    else:
        m = _model(mesh)
        settings = {case: True} if case != "async" else {}
    try:
        if case == "async":
            AsyncDSSync(m, process_group=mesh.get_group("replicate"), timeout_s=60)
        DSSync(m, process_group=mesh.get_group("replicate"), timeout_s=60, **settings)
    except UsageError as e:
        return str(e)
    return ""


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_cannot_work_is_refused_on_every_rank(quick, case):
    for message in [r[f"refused-{case}"] for r in quick]:
        for w in REFUSALS[case]:
            assert w in message, message
