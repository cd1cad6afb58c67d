"""A non-finite value never leaves its rank (issue 42, item 1).

A NaN or Inf in one rank's weights is found on the device before its buffers go out (a sum per
buffer, in the tag); every member of its group keeps its own values for that averaging, the
wire's error memory keeps nothing non-finite, and with ``nonfinite="raise"`` (the default) the
rank at fault raises ``SyncError`` naming itself, the step and the tensor, its partners naming
it. ``nonfinite="skip"`` warns once and trains on. Both paths are covered: the CPU's (the
verdict read after gloo's wait) and a GPU's (applied on the device, read one averaging later).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync import DSSync, Global, Options, Shuffle
from dssync.errors import SyncError, UsageError
from dssync.lab.launch import spawn

BAD = 1  # the rank whose weights go bad


def device_path() -> None:
    """Make this process apply verdicts as on a GPU (on the device, read one averaging later;
    as tests/comm/test_host_reads.py)."""
    import dssync.comm.averager as averager
    import dssync.comm.tags as tags
    import dssync.comm.transport as transport

    tags.reads_free = averager.reads_free = transport.reads_free = lambda device: False


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


def _finite(tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _poisoned(options: dict, value: float) -> dict:
    """Two steps, then ``value`` in rank BAD's first weight, then one step (and, on the device
    path, the verdict read where the code waits)."""
    rank = dist.get_rank()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = DSSync(model, timeout_s=20, **options)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sync.step()

    for _ in range(2):
        step()
    if rank == BAD:
        with torch.no_grad():
            model[0].weight[2, 3] = value
    group = sync.current_group()
    before = [p.detach().clone() for p in model.parameters()]
    error, ranks = None, None
    try:
        step()
        sync.router.settle()  # the device path reads its verdict here (the CPU's already did)
    except SyncError as e:
        error, ranks = str(e), e.ranks
    after = [p.detach() for p in model.parameters()]
    out = {
        "group": group,
        "error": error,
        "ranks": ranks,
        "finite": _finite(after),
        "residuals finite": _finite(sync.router.residuals.tensors),
        # what the averaging did: nothing in the bad group (bar the optimizer's step)
        "moved": max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True)),
    }
    sync.close()
    return out


CASES = [
    ("fp32 pairs", {"schedule": Shuffle(2, seed=3)}, math.nan),
    ("groups of 3", {"schedule": Shuffle(3, seed=3, uneven=True)}, math.nan),
    ("groups of 4", {"schedule": Shuffle(4, seed=3)}, math.inf),
    ("global", {"schedule": Global()}, math.nan),
    ("int8 pairs", {"schedule": Shuffle(2, seed=3), "wire": "int8"}, math.inf),
    ("int8 groups of 4", {"schedule": Shuffle(4, seed=3), "wire": "int8"}, -math.inf),
    ("bf16 pairs", {"schedule": Shuffle(2, seed=3), "wire": "bf16"}, math.nan),
]


def _every_case(forced: bool, cases) -> list[dict]:
    if forced:
        device_path()
    return [_poisoned(options, value) for _, options, value in cases]


def _check(results: list[list[dict]], cases) -> None:
    for c, (name, _, _) in enumerate(cases):
        outs = [per_rank[c] for per_rank in results]
        group = outs[BAD]["group"]
        assert BAD in group and len(group) > 1, name
        for rank, out in enumerate(outs):
            where = f"{name}, rank {rank}: {out['error']}"
            assert out["residuals finite"], where
            if rank == BAD:
                assert not out["finite"], where  # its own NaN stays with it
                assert out["error"] and "non-finite values on this rank (rank 1)" in out["error"]
                # the tensor by name (the NaN spread through the first layer by its own backward)
                assert "in 0.weight (element " in out["error"], where
                assert "of shape (8, 8), bucket 0)" in out["error"], where
                assert "averaging 2" in out["error"], where
                assert out["ranks"] == [BAD], where
                continue
            assert out["finite"], f"{where}: the NaN or Inf reached this rank"
            if rank in group:
                assert (
                    out["error"] and f"rank {BAD} of group {group} had non-finite" in out["error"]
                )
                assert out["ranks"] == [BAD], where
                assert out["moved"] < 0.05, f"{where}: the group's averaging was applied"
            else:
                assert out["error"] is None, where


@pytest.mark.slow
def test_a_nan_stays_on_its_rank_in_a_pair():
    cases = CASES[:1]
    _check(spawn(_every_case, 4, args=(False, cases), timeout_s=180), cases)


@pytest.mark.slow
@pytest.mark.parametrize("forced", [False, True], ids=["cpu path", "device path"])
def test_a_nonfinite_value_never_leaves_its_rank(forced):
    _check(spawn(_every_case, 4, args=(forced, CASES), timeout_s=400), CASES)


def _skips(wire: str, forced: bool) -> dict:
    if forced:
        device_path()
    rank = dist.get_rank()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync = DSSync(model, timeout_s=20, wire=wire, nonfinite="skip", schedule=Shuffle(2, seed=3))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sync.step()

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            step()
        clean = [p.detach().clone() for p in model.parameters()]
        if rank == BAD:
            with torch.no_grad():
                model[0].weight[2, 3] = math.nan
        model[0].weight.grad = None
        sync.step()  # this averaging is skipped by BAD's group
        residual_ok = _finite(sync.router.residuals.tensors)
        if rank == BAD:  # as a loss-scaled run would: back to a clean model
            with torch.no_grad():
                for p, c in zip(model.parameters(), clean, strict=True):
                    p.copy_(c)
        for _ in range(6):
            step()
        sync.router.settle()
    said = [str(w.message) for w in seen if "non-finite" in str(w.message)]
    sync.average_all()
    out = {
        "said": said,
        "residuals finite": residual_ok and _finite(sync.router.residuals.tensors),
        "finite": _finite(model.parameters()),
        "weights": [p.detach().clone() for p in model.parameters()],
        "group": sync.schedule.partition(2, 4),
    }
    sync.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("wire", "forced"), [("fp32", False), ("int8", False), ("bf16", False), ("int8", True)]
)
def test_skip_mode_warns_once_and_trains_on(wire, forced):
    outs = spawn(_skips, 4, args=(wire, forced), timeout_s=240)
    group = next(g for g in outs[0]["group"] if BAD in g)
    for rank, out in enumerate(outs):
        assert out["finite"] and out["residuals finite"], rank
        assert len(out["said"]) == (1 if rank in group else 0), (rank, out["said"])
        for a, b in zip(out["weights"], outs[0]["weights"], strict=True):
            assert torch.equal(a, b)  # average_all still leaves every rank alike
    assert "rank(s) [1] had non-finite values" in outs[BAD]["said"][0]


def _spreads(forced: bool) -> dict:
    if forced:
        device_path()
    rank = dist.get_rank()
    model = _model()
    # 2 ranks: one pair, point to point; 3: the global average, an all-reduce on the world
    schedule = Shuffle(2) if dist.get_world_size() == 2 else Global()
    sync = DSSync(model, schedule=schedule, timeout_s=20, nonfinite="spread")
    with torch.no_grad():
        if rank == BAD:
            model[0].weight[2, 3] = math.nan
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sync.step()  # no check: the NaN goes out, as with DDP, and nothing is said
        sync.router.settle()  # on the device path, a verdict left there would raise here
    out = {"nan": bool(model[0].weight[2, 3].isnan()), "said": [str(w.message) for w in seen]}
    sync.close()
    return out


@pytest.mark.parametrize("forced", [False, True], ids=["cpu path", "device path"])
@pytest.mark.parametrize(
    "world",
    [2, pytest.param(3, marks=pytest.mark.slow)],  # the quick tier keeps the pair
    ids=["pair", "collective of 3"],
)
def test_spread_mode_does_not_look_and_the_nan_reaches_the_group(world, forced):
    for rank, out in enumerate(spawn(_spreads, world, args=(forced,), timeout_s=120)):
        assert out == {"nan": True, "said": []}, rank


def _all_bad(value: float, mode: str) -> dict:
    """Every rank puts ``value`` in the same weight, then averages in pairs (4 ranks: point to
    point, the tag in the data)."""
    model = _model()
    sync = DSSync(model, schedule=Shuffle(2, seed=3), timeout_s=20, nonfinite=mode)
    with torch.no_grad():
        model[0].weight[2, 3] = value
    before = [p.detach().clone() for p in model.parameters()]
    out: dict = {"error": None}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            sync.step()
        except SyncError as e:
            out["error"] = str(e)
    out["said"] = [str(w.message) for w in seen]
    out["kept"] = all(  # bit for bit, a NaN equal to itself
        torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
        for a, b in zip(before, model.parameters(), strict=True)
    )
    sync.close()
    return out


@pytest.mark.slow  # 9 s each, spawning 4 ranks
@pytest.mark.parametrize(
    "value, mode, says",
    [
        (math.nan, "raise", "non-finite values on this rank (rank {rank})"),
        (math.inf, "raise", "non-finite values on this rank (rank {rank})"),
        (math.nan, "skip", "rank(s) [{pair}] had non-finite values"),
    ],
    ids=["both nan", "both inf", "both nan, skip"],
)
def test_a_pair_where_both_go_bad_names_both_and_keeps_its_values(value, mode, says):
    schedule = Shuffle(2, seed=3)
    for rank, out in enumerate(spawn(_all_bad, 4, args=(value, mode), timeout_s=120)):
        pair = ", ".join(map(str, sorted(g for g in schedule.partition(0, 4) if rank in g)[0]))
        text = says.format(rank=rank, pair=pair)
        assert out["kept"], rank  # no value of the other came in
        if mode == "raise":
            assert out["error"] is not None and text in out["error"], (rank, out)
        else:
            assert out["error"] is None and len(out["said"]) == 1 and text in out["said"][0]


def test_an_unknown_nonfinite_mode_names_the_three():
    with pytest.raises(UsageError, match="choose 'raise', 'skip' or 'spread'"):
        Options(nonfinite="ignore").check()
