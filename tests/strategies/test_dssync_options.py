"""The one DSSync's options: local steps, the outer optimizer (DiLoCo), refusals, agreement, resume."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dssync import DSSync, Global, Shuffle, nesterov
from dssync.errors import UsageError
from dssync.lab.launch import WorkerError, spawn
from dssync.schedules.topology import plan_topology_aware
from dssync.strategies.options import Options
from dssync.topology import Topology

H, ROUNDS, LR = 3, 4, 0.1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(8, 4, generator=g)
    return x, x.sum(1, keepdim=True) + rank


def _inner_step(model: nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> None:
    x, y = _batch(rank, step)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _diloco_rank() -> list[torch.Tensor]:
    rank = dist.get_rank()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sync = DSSync(model, schedule=Global(), every=H, outer=nesterov())
    for step in range(H * ROUNDS):
        _inner_step(model, opt, rank, step)
        sync.step()
    assert sync.averagings == ROUNDS and sync.steps == H * ROUNDS
    return [p.detach().clone() for p in model.parameters()]


def _replicas(workers: int):
    """One process's stand-in for ``workers`` ranks: the anchor and DiLoCo's outer optimizer,
    and each rank's model and inner optimizer."""
    anchor = [p.detach().clone() for p in _model().parameters()]
    outer = torch.optim.SGD(anchor, lr=0.7, momentum=0.9, nesterov=True)
    models = [_model() for _ in range(workers)]
    inner = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    return anchor, outer, models, inner


def _inner_round(models: list[nn.Module], inner: list, step: int) -> int:
    """H inner steps on every model from ``step``; the step after them."""
    for _ in range(H):
        for r, (m, opt) in enumerate(zip(models, inner, strict=True)):
            _inner_step(m, opt, r, step)
        step += 1
    return step


def _reference_diloco(workers: int) -> list[torch.Tensor]:
    """DiLoCo as in the paper, on one process: N inner models, mean pseudo-gradient, outer Nesterov."""
    anchor, outer, models, inner = _replicas(workers)
    step = 0
    for _ in range(ROUNDS):
        step = _inner_round(models, inner, step)
        for i, a in enumerate(anchor):
            a.grad = torch.stack([a - list(m.parameters())[i].detach() for m in models]).mean(0)
        outer.step()
        with torch.no_grad():
            for m in models:
                for p, a in zip(m.parameters(), anchor, strict=True):
                    p.copy_(a)
    return anchor


def test_global_every_outer_is_diloco():
    out = spawn(_diloco_rank, 3, timeout_s=120)
    ref = _reference_diloco(3)
    for rank in range(3):
        for got, want in zip(out[rank], ref, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(ref[0], _model()[0].weight)  # it trained


def _late_diloco_rank() -> list[torch.Tensor]:
    rank = dist.get_rank()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sync = DSSync(model, schedule=Global(), every=H, outer=nesterov(), overlap=True)
    for step in range(H * ROUNDS):
        _inner_step(model, opt, rank, step)
        sync.step()
    sync.close()  # waits for the last average in flight and merges it, with its outer step
    return [p.detach().clone() for p in model.parameters()]


def _reference_late_diloco(workers: int) -> list[list[torch.Tensor]]:
    """DiLoCo with its outer step one window late, on one process: each round sends the models
    and trains on; the mean sent a round before is applied as DiLoCo's outer step to the anchor,
    and each model restarts from the anchor plus its progress since it sent. ``close()`` applies
    the last one."""
    anchor, outer, models, inner = _replicas(workers)

    @torch.no_grad()
    def late_step(sent: list[list[torch.Tensor]]) -> None:
        for i, a in enumerate(anchor):
            a.grad = a - torch.stack([s[i] for s in sent]).mean(0)
        outer.step()
        for m, s in zip(models, sent, strict=True):
            for p, a, si in zip(m.parameters(), anchor, s, strict=True):
                p.copy_(a + (p - si))

    sent = None
    step = 0
    for _ in range(ROUNDS):
        step = _inner_round(models, inner, step)
        if sent is not None:
            late_step(sent)
        sent = [[p.detach().clone() for p in m.parameters()] for m in models]
    late_step(sent)
    return [[p.detach().clone() for p in m.parameters()] for m in models]


def test_global_every_outer_with_overlap_is_diloco_one_window_late():
    out = spawn(_late_diloco_rank, 3, timeout_s=120)
    ref = _reference_late_diloco(3)
    for rank in range(3):
        for got, want in zip(out[rank], ref[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    on_time = _reference_diloco(3)
    assert not torch.equal(ref[0][0], on_time[0])  # late is not the same as on time


def _shuffle_outer_no_gradients(rounds: int) -> list[torch.Tensor]:
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.Linear(5, 3)
    sync = DSSync(model, schedule=Shuffle(2, seed=4), outer=nesterov(), broadcast_init=False)
    flat = [torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()]
    for _ in range(rounds):
        sync.step()  # no gradient steps in between: only averaging and the outer step
        flat.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double())
    return flat


def test_outer_nesterov_in_shuffled_pairs_keeps_the_mean_and_contracts():
    rounds = 40
    out = spawn(_shuffle_outer_no_gradients, 4, args=(rounds,), timeout_s=120)
    stack = [torch.stack([out[r][t] for r in range(4)]) for t in range(rounds + 1)]
    mean0 = stack[0].mean(0)

    def spread(t: int) -> float:
        return (stack[t] - stack[t].mean(0)).norm().item()

    for t in range(rounds + 1):
        torch.testing.assert_close(stack[t].mean(0), mean0, rtol=0, atol=1e-5)
    assert spread(rounds) < 0.05 * spread(0), [round(spread(t), 4) for t in range(0, rounds, 5)]


def _local_steps(every: int) -> tuple[list[int], int]:
    """Which optimizer steps changed the parameters through the sync (the averagings)."""
    rank = dist.get_rank()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sync = DSSync(model, every=every)
    changed = []
    for step in range(7):
        _inner_step(model, opt, rank, step)
        before = [p.detach().clone() for p in model.parameters()]
        sync.step()
        if any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)):
            changed.append(step + 1)
    return changed, sync.averagings


def test_every_averages_after_every_hth_step_only():
    for changed, averagings in spawn(_local_steps, 2, args=(3,), timeout_s=120):
        assert changed == [3, 6] and averagings == 2


def _outer_rate_one(outer: bool, overlap: bool = False) -> list[torch.Tensor]:
    rank = dist.get_rank()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    plain = nesterov(lr=1.0, momentum=0.0) if outer else None
    sync = DSSync(model, schedule=Shuffle(2, seed=5), every=2, outer=plain, overlap=overlap)
    for step in range(8):
        _inner_step(model, opt, rank, step)
        sync.step()
    sync.close()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("overlap", [False, True])
def test_outer_sgd_at_rate_one_without_momentum_is_plain_local_steps(overlap):
    with_outer = spawn(_outer_rate_one, 4, args=(True, overlap), timeout_s=120)
    without = spawn(_outer_rate_one, 4, args=(False, overlap), timeout_s=120)
    for a, b in zip(with_outer, without, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def _default_schedule_odd_world() -> list[int]:
    sync = DSSync(nn.Linear(3, 2))
    for _ in range(3):
        sync.step()
    return sync.current_group()


def test_default_schedule_accepts_an_odd_world():
    groups = spawn(_default_schedule_odd_world, 3, timeout_s=120)
    assert sorted({tuple(g) for g in groups}, key=len) in (
        [(0,), (1, 2)],
        [(1,), (0, 2)],
        [(2,), (0, 1)],
    )


TOPO = Topology(hosts=(0, 0, 1, 1), racks=(0, 0, 1, 1))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"every": 0}, "every=0"),
        ({"replan": -1}, "replan=-1"),
        ({"replan": 4}, "topology-aware"),
        ({"replan": 4, "schedule": Shuffle(2)}, "topology-aware"),
        ({"topology": TOPO, "schedule": Shuffle(2)}, "not both"),
        ({"topology": TOPO, "replan": 4, "overlap": True}, "overlap=True with replan"),
        ({"outer": "nesterov"}, "factory"),
        ({"fragments": 0}, "fragments=0"),
        ({"timeout_s": 0}, "timeout_s=0"),
        ({"timeout_s": None}, "timeout_s=None"),
        ({"nonfinite": "ignore"}, "nonfinite='ignore'"),
        ({"pairs": "ring"}, "pairs='ring'"),
        ({"wire": "int4"}, "int4"),
    ],
)
def test_a_pair_that_cannot_work_is_refused_naming_it(options, named):
    with pytest.raises(UsageError, match=named):
        Options(**options).check()


def test_replan_on_a_topology_plan_given_as_schedule_is_accepted():
    Options(schedule=plan_topology_aware(TOPO, max_every=4), replan=4).check()


def test_options_are_one_object_that_dssync_keywords_fill_in():
    base = Options(every=4, wire="int8")
    assert base.replace(every=8) == Options(every=8, wire="int8")
    assert base.describe() == "every=4, wire='int8'" and Options().describe() == ""
    with pytest.raises(TypeError, match="did you mean every="):
        base.replace(evry=2)
    ours, rest = Options.split({"every": 2, "process_group_backend": "gloo"})
    assert ours == {"every": 2} and rest == {"process_group_backend": "gloo"}
    labels = " ".join(Options().agreement())
    for name in ("every", "wire", "overlap", "replan", "average_grads", "nonfinite", "pairs"):
        assert name in labels


def _disagree(knob: str):
    rank = dist.get_rank()
    options = {
        "every": {"every": 1 + rank},
        "outer": {"outer": nesterov() if rank else None},
        "outer lr": {"outer": nesterov(lr=0.7 + 0.1 * rank)},
        "overlap": {"overlap": bool(rank)},
        "replan": {"topology": Topology(hosts=(0, 1), racks=(0, 1)), "replan": 4 + 4 * rank},
    }[knob]
    DSSync(nn.Linear(3, 2), timeout_s=30, **options)


@pytest.mark.parametrize(
    ("knob", "named"),
    [
        ("every", "every"),
        ("outer", "outer optimizer"),
        ("outer lr", "outer optimizer"),
        ("overlap", "overlap"),
        ("replan", "replan"),
    ],
)
def test_start_up_agreement_names_another_option(knob, named):
    with pytest.raises(WorkerError) as e:
        spawn(_disagree, 2, args=(knob,), timeout_s=120)
    assert named in e.value.message and "UsageError" in e.value.exc_types[0]


RESUME = {
    "every": {"every": 3},
    "outer": {"every": 2, "outer": nesterov()},
    "overlap": {"overlap": True, "every": 2},
    "overlap-outer": {"overlap": True, "every": 2, "outer": nesterov()},
    "replan": {"topology": TOPO, "replan": 2},
    "topology-outer": {"topology": TOPO, "every": 2, "outer": nesterov()},
}


def _resume_run(options_name: str, total: int, cut: int) -> tuple[bytes, bytes]:
    """Train ``total`` steps straight and again resumed at ``cut``: both final states, as bytes."""
    rank = dist.get_rank()

    def make():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        sync = DSSync(model, optimizer=opt, **RESUME[options_name])
        if sync.replanner is not None:
            sync.replanner.min_signal_s = 10.0  # timings never decide: the same re-plans twice
        return model, opt, sync

    def final(model, opt):
        tensors = [*model.parameters(), *[s["momentum_buffer"] for s in opt.state.values()]]
        return b"".join(t.detach().numpy().tobytes() for t in tensors)

    model, opt, sync = make()
    saved = None
    for step in range(total):
        if step == cut:
            saved = copy.deepcopy((model.state_dict(), opt.state_dict(), sync.state_dict()))
        _inner_step(model, opt, rank, step)
        sync.step()
    sync.finish()
    straight = final(model, opt)
    sync.close()

    model, opt, sync = make()
    model.load_state_dict(saved[0])
    opt.load_state_dict(saved[1])
    sync.load_state_dict(saved[2])
    for step in range(cut, total):
        _inner_step(model, opt, rank, step)
        sync.step()
    sync.finish()
    resumed = final(model, opt)
    sync.close()
    return straight, resumed


@pytest.mark.parametrize("options_name", sorted(RESUME))
def test_resume_is_bit_exact_with_each_option(options_name):
    out = spawn(_resume_run, 4, args=(options_name, 11, 5), timeout_s=180)
    for straight, resumed in out:
        assert straight == resumed


def _refuse_other_options() -> str:
    model = _model()
    sync = DSSync(model, every=2, outer=nesterov())
    state = sync.state_dict()
    other = DSSync(_model(), every=2)
    try:
        other.load_state_dict(state)
    except UsageError as e:
        return str(e)
    return ""


def test_a_checkpoint_with_other_options_is_refused():
    for message in spawn(_refuse_other_options, 2, timeout_s=120):
        assert "outer=" in message and "--outer" not in message  # Python names, not flags


def _closed_leaves_no_group() -> tuple[int, int, list[bool]]:
    model = _model()
    sync = DSSync(model, Shuffle(2, seed=1, repeat=2), pairs="all_reduce", overlap=True)
    for _ in range(3):
        sync.step()
    sync.average_all()
    made = list(sync.router.groups.values()) + [sync._hook("overlap").lane.group]
    sync.close()
    sync.close()  # once is enough: a second call does nothing

    def gone(pg) -> bool:
        try:
            dist.get_backend(pg)
        except (ValueError, RuntimeError):
            return True
        return False

    return len(made), len(sync.router.groups), [gone(pg) for pg in made]


def test_close_destroys_the_groups_it_made_and_stops_the_lane():
    # A process that trains several runs in turn (train_series) closes each run's strategy.
    for made, left, gone in spawn(_closed_leaves_no_group, 4, timeout_s=120):
        assert made >= 2 and left == 0 and all(gone), (made, left, gone)


@pytest.mark.parametrize(
    "name,least",
    [
        ("dssync.strategies.options", 30),  # an example of each option
        ("dssync.strategies.hooks", 4),
        ("dssync.strategies.outer", 6),
        ("dssync.testing.ranks", 4),
    ],
)
def test_the_docstring_examples_run(name, least):
    import doctest
    import importlib

    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= least and result.failed == 0, result
