"""Parameter data on the training group, metadata on the side group: checked on a strict backend.

Every strategy and helper that communicates runs on 3 ranks whose default group is the "strict"
test backend (see strict_backend.py): it refuses, as nccl would, tensors that are not training
data (here: not float16) and gloo-only operations. A case fails when dssync sends metadata through
the training group. One spawn runs every case (starting workers is the slow part); each case
reports its own outcome, and the parameters must agree across ranks where the strategy promises so.
"""

from __future__ import annotations

import pytest
import strict_backend as strict
import torch
import torch.distributed as dist
from torch import nn

from dssync.lab.baselines.protocol import after_backward
from dssync.lab.launch import spawn

WORLD = 3  # three, so Shuffle(2) makes a real pair (a group smaller than the world)
STEPS = 4


def _model(seed: int | None = None) -> nn.Module:
    torch.manual_seed(dist.get_rank() if seed is None else seed)  # ranks start apart
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).to(strict.DATA_DTYPE)


def _wide() -> nn.Module:
    """Over three int8 chunks (4226 parameters), so each of 3 ranks owns a share of its own in a
    two-stage average (a smaller model leaves two of them empty shares)."""
    torch.manual_seed(dist.get_rank())
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)).to(strict.DATA_DTYPE)


def _train(strategy, steps: int = STEPS) -> None:
    opt = torch.optim.SGD(strategy.module.parameters(), lr=0.1)
    width = next(strategy.module.parameters()).shape[1]
    for _ in range(steps):
        x = torch.randn(5, width, dtype=strict.DATA_DTYPE)
        strategy.model(x).float().pow(2).mean().backward()
        after_backward(strategy)
        opt.step()
        strategy.after_step()
        opt.zero_grad()
    strategy.average_all()


def _checksum(module: nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in module.parameters()))


def case_refuses_metadata() -> float:
    """The rule can fail: float64 and int64 tensors and monitored_barrier are refused."""
    ok = torch.ones(2, dtype=strict.DATA_DTYPE)
    dist.all_reduce(ok)
    for bad in (torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.int64)):
        with pytest.raises(strict.Refused):
            dist.all_reduce(bad)
    with pytest.raises((strict.Refused, ValueError)):  # torch itself refuses it off gloo
        dist.monitored_barrier()
    return float(ok.sum())


def case_side_group() -> float:
    """The twin of a strict group is gloo, made once; a gloo group is its own twin."""
    from datetime import timedelta

    from dssync.comm.side import side_group, timeout_of

    side = side_group()
    assert dist.get_backend(side) == "gloo" and side is not dist.group.WORLD
    assert side_group() is side
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=17))
    assert side_group(gloo) is gloo and timeout_of(gloo) == timedelta(seconds=17)
    return 0.0


def case_fingerprint_check() -> float:
    from dssync.comm.consensus import fingerprint_check

    fingerprint_check({"model": 12345, "schedule": 7})
    return 0.0


def case_fingerprint_mismatch() -> float:
    from dssync.comm.consensus import fingerprint_check
    from dssync.errors import UsageError

    with pytest.raises(UsageError, match=r"ranks \[1\] differ"):
        fingerprint_check({"schedule": 7 + (dist.get_rank() == 1)}, fixes={"schedule": "same seed"})
    return 0.0


def case_consensus_distance() -> float:
    """Its value against the definition, computed by hand from every rank's model rebuilt here."""
    from dssync.comm.consensus import consensus_distance

    got = consensus_distance(_model())
    xs = [
        torch.cat([p.detach().double().reshape(-1) for p in _model(r).parameters()])
        for r in range(WORLD)
    ]
    mean = sum(xs) / WORLD
    want = float(sum(((x - mean) ** 2).sum() for x in xs) / WORLD / (mean**2).sum())
    assert want > 0.1 and got == pytest.approx(want, rel=1e-9), (got, want)
    return got


def case_detect_probe() -> float:
    from dssync.topology import detect

    topo = detect(
        probe=True,
        probe_bytes=4096,
        probe_rounds=1,
        timeout_s=20,
        device=torch.device("cpu"),
        dtype=strict.DATA_DTYPE,
    )
    return float(topo.world_size)


def case_dssync() -> float:
    from dssync import DSSync, Shuffle

    model = _model()
    _train(DSSync(model, schedule=Shuffle(2, seed=0, uneven=True)))
    return _checksum(model)


def case_dssync_int8() -> float:
    """A pair and a rank alone on the int8 wire: one int8 tensor per message, scales inside."""
    from dssync import DSSync, Shuffle

    model = _wide()
    _train(DSSync(model, schedule=Shuffle(2, seed=0, uneven=True), wire="int8"))
    return _checksum(model)


def case_global_int8() -> float:
    """Three ranks at once on the int8 wire: the two-stage average (shares, then means)."""
    from dssync import DSSync, Global

    model = _wide()
    _train(DSSync(model, schedule=Global(), every=2, wire="int8"))
    return _checksum(model)


def case_global_bf16() -> float:
    from dssync import DSSync, Global

    model = _wide()
    _train(DSSync(model, schedule=Global(), wire="bf16"))
    return _checksum(model)


def case_dssync_in_a_subgroup() -> float | None:
    """DSSync on a strict group of ranks 0 and 1: its side group is made by those ranks alone."""
    from dssync import DSSync, Shuffle

    sub = dist.new_group([0, 1])  # every rank makes it; only ranks 0 and 1 train
    if dist.get_rank() not in (0, 1):
        return None
    model = _model()
    _train(DSSync(model, schedule=Shuffle(2, seed=0), process_group=sub))
    return _checksum(model)


def case_adaptive() -> float:
    from dssync import DSSync
    from dssync.topology import Topology

    model = _model()
    topo = Topology(hosts=tuple(range(WORLD)), racks=(0,) * WORLD)
    _train(DSSync(model, topology=topo, replan=2))
    return _checksum(model)


def case_local_sgd() -> float:
    from dssync.lab.baselines import LocalSGD

    model = _model()
    _train(LocalSGD(model, every=2))
    return _checksum(model)


def case_hierarchical() -> float:
    from dssync.lab.baselines import Hierarchical

    model = _model()
    _train(Hierarchical(model))
    return _checksum(model)


def case_bsp() -> float:
    from dssync.lab.baselines import BSP

    model = _model()
    _train(BSP(model))
    return _checksum(model)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def _run_cases() -> dict[str, tuple[str, object]]:
    strict.use_strict_world(timeout_s=20)
    side = dist.new_group(backend="gloo")  # to line the ranks up again after a refused case
    out: dict[str, tuple[str, object]] = {}
    for name, fn in CASES.items():
        try:
            out[name] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - reported per case to the parent
            first = (str(e).strip().splitlines() or [""])[0]
            out[name] = ("error", f"{type(e).__name__}: {first[:300]}")
        dist.barrier(group=side)
    return out


@pytest.fixture(scope="module")
def outcomes() -> list[dict[str, tuple[str, object]]]:
    return spawn(_run_cases, WORLD, timeout_s=240, collective_timeout_s=30)


@pytest.mark.parametrize("case", list(CASES))
def test_runs_on_a_strict_training_group(outcomes, case):
    results = [rank_out[case] for rank_out in outcomes]
    errors = [f"rank {r}: {v}" for r, (kind, v) in enumerate(results) if kind == "error"]
    assert not errors, "\n".join(errors)
    agree = ("dssync", "dssync_int8", "global_int8", "global_bf16", "dssync_in_a_subgroup")
    if case in (*agree, "adaptive", "local_sgd", "hierarchical", "bsp"):
        values = [v for _, v in results if v is not None]
        assert len(values) >= 2 and values == pytest.approx([values[0]] * len(values), abs=1e-3)
