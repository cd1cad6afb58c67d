"""dssync.lab.auto: --sync auto in a script returns the DSSync it picked, configured, and says why."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from dssync.errors import UsageError
from dssync.lab.launch import spawn


def _picked_and_trained():
    import dssync.lab.plan.auto as planner
    from dssync.lab import auto
    from dssync.lab.plan.auto import Choice
    from dssync.strategies import DSSync

    torch.manual_seed(0)  # one model, as DSSync's broadcast from rank 0 makes it anyway
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16))
    torch.manual_seed(1 + dist.get_rank())  # each rank its own data
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 16)
    before = [t.detach().clone() for t in (*model.parameters(), *model.buffers())]

    def loss():
        return torch.nn.functional.mse_loss(model(x), y)

    choose = planner.choose
    planner.choose = lambda *a, **k: Choice("bsp", "bsp: predicted fastest", ())
    try:
        auto(model, loss, probe=False)
        refused = None
    except UsageError as e:
        refused = str(e)
    finally:
        planner.choose = choose

    sync, decision = auto(model, loss, optimizer=opt, probe=False, timeout_s=60)
    after = (*model.parameters(), *model.buffers())
    untouched = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    grads = [p.grad for p in model.parameters()]
    first = loss().item()
    for _ in range(12):
        loss().backward()
        opt.step()
        opt.zero_grad()
        sync.step()
    sync.average_all()
    weight = model[0].weight.detach().clone()
    sync.close()
    again, kept = auto(model, loss, keep=decision.to_dict(), probe=False, timeout_s=60)
    again.close()
    return {
        "refused": refused,
        "dssync": isinstance(sync, DSSync),
        "method": decision.method,
        "line": decision.line(),
        "every": sync.every,
        "averagings": sync.averagings,
        "untouched": untouched,
        "grads": grads,
        "loss": (first, loss().item()),
        "weight": weight,
        "kept": (kept.method, kept.every, kept.line(), again.every),
        "picked_every": decision.every,
    }


def test_auto_returns_the_picked_dssync_which_trains_and_says_why():
    r0, r1 = spawn(_picked_and_trained, 2, timeout_s=240)
    for r in (r0, r1):
        assert r["refused"].startswith("auto() picked bsp, which is not a DSSync")
        assert "DistributedDataParallel" in r["refused"]
        assert r["dssync"] and r["line"].startswith(f"auto(): {r['method']}: predicted")
        # the timed passes left no trace: the same values, no gradients
        assert r["untouched"] and all(g is None for g in r["grads"])
        assert r["averagings"] == 12 // r["every"] > 0
        assert r["loss"][1] < r["loss"][0]  # it learned
        method, every, line, built = r["kept"]  # keep= replays the pick, without timing
        assert (method, every, built) == (r["method"], r["picked_every"], r["every"])
        assert line == r["line"].replace("auto()", "auto(keep=...)", 1)
    assert r0["method"] == r1["method"] and r0["line"] == r1["line"]  # every rank picks alike
    assert torch.equal(r0["weight"], r1["weight"])  # the final average: one model


def test_keep_with_an_option_it_would_override_is_refused():
    from dssync.lab import auto

    with pytest.raises(UsageError, match=r"keep= replays a saved pick with its own every; drop"):
        auto(torch.nn.Linear(2, 1), lambda: None, keep={"method": "diloco"}, every=4)


def test_auto_outside_a_process_group_names_the_fix():
    from dssync.lab import auto

    model = torch.nn.Linear(2, 1)
    with pytest.raises(UsageError, match="init_process_group first"):
        auto(model, lambda: model(torch.ones(1, 2)).sum())


def test_the_reason_names_the_arguments_a_script_gave_and_the_flags_the_cli_gave():
    from dssync.lab.cluster import load_cluster
    from dssync.lab.config import TrainConfig
    from dssync.lab.train.auto import pick

    topology = load_cluster("s2-inter-rack").topology()
    cfg = TrainConfig(sync="auto", every=8, outer="nesterov", group_size=2)
    model = torch.nn.Linear(1000, 1600)  # 1.6M parameters: a local-step pick on S2
    cli, script = pick(cfg, topology, model, 0.02), pick(cfg, topology, model, 0.02, by="auto()")
    said = {"--every": "every=", "--outer": "outer=", "--group-size": "group_size="}
    assert all(f"as {f} says" in cli.reason for f in said), cli.reason
    for f, argument in said.items():
        cli = replace(cli, reason=cli.reason.replace(f, argument))
    assert script.reason == cli.reason
    assert script.line() == "auto(): " + script.reason


def _one_rank():
    from dssync.lab import auto

    model = torch.nn.Linear(2, 1)
    try:
        auto(model, lambda: model(torch.ones(1, 2)).sum(), probe=False)
    except UsageError as e:
        return str(e)


def test_auto_on_one_rank_asks_for_two():
    (message,) = spawn(_one_rank, 1, timeout_s=100)
    assert message.startswith("auto(...) plans how ranks average, and the group has 1 rank")
