"""What every registered workload promises: determinism, float parameters, DDP-friendliness."""

from __future__ import annotations

import pytest
import torch
from workload_helpers import first_batch

from dssync.lab.launch import spawn
from dssync.lab.workloads import WORKLOADS, get

TINY = {
    "wrn": {"depth": 10, "width": 1},
    "bert": {"max_docs": 4, "dim": 32, "layers": 1, "heads": 2, "seq_len": 32},
    "deepfm": {"dim": 4, "hidden": "16"},
}


def test_registry_names():
    assert {"mnist", "digits", "wrn", "bert", "deepfm"} <= set(WORKLOADS)
    with pytest.raises(ValueError, match="unknown workload"):
        get("resnet")


@pytest.mark.parametrize("name", sorted(TINY))
def test_deterministic_float_and_every_parameter_gets_a_gradient(name):
    wl = get(name, **TINY[name])
    torch.manual_seed(3)
    a = wl.model()
    torch.manual_seed(3)
    b = wl.model()
    for (na, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert pa.is_floating_point(), na
        assert torch.equal(pa, pb), na
    wl.loss(a, first_batch(wl, 8)).backward()
    missing = [n for n, p in a.named_parameters() if p.grad is None]
    assert not missing, f"unused parameters would break DDP: {missing}"


@pytest.mark.parametrize("name", sorted(TINY))
def test_same_data_on_every_build(name):
    (tr1, te1), (tr2, te2) = get(name, **TINY[name]).datasets(), get(name, **TINY[name]).datasets()
    assert len(tr1) == len(tr2) and len(te1) == len(te2)
    for x, y in zip(tr1[0] + te1[-1], tr2[0] + te2[-1], strict=True):
        assert torch.equal(x, y)


def _ddp_steps() -> bool:
    for name, options in TINY.items():
        wl = get(name, **options)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(wl.model())
        batch = first_batch(wl, 8)
        for _ in range(2):  # a second step fails if the first left parameters unused
            wl.loss(model, batch).backward()
    return True


def test_ddp_wraps_each_model():
    # In worker processes: a gloo group torn down inside the test process can hang in its destructor.
    assert spawn(_ddp_steps, 2, timeout_s=240) == [True, True]


def test_mnist_declares_a_target_and_a_run_long_enough_for_it_per_width():
    from dssync.lab.cli.options import config

    assert (get("mnist").quality_target(), get("mnist").default_epochs()) == (0.85, 4)
    wide = get("mnist", hidden=2048)
    assert (wide.quality_target(), wide.default_epochs()) == (0.91, 12)
    assert get("mnist", hidden=512).quality_target() is None
    assert config({"workload": "mnist", "workload_options": {"hidden": 2048}}).epochs == 12
    assert config({"workload": "mnist", "epochs": 3}).epochs == 3  # --epochs wins
    assert config({"workload": "wrn"}).epochs == get("wrn").epochs
