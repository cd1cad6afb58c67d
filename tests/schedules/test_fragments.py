"""Fragments: one slice of the model per step, for any schedule; the distributed path against a
one-process reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dssync import DSSync, Shuffle
from dssync.errors import UsageError
from dssync.launch import spawn
from dssync.schedules import Fragments, TopologyAware, group_of, spectral_gap
from dssync.schedules.base import part_slice


def test_fragments_rotate_and_keep_the_groups():
    s = Fragments(Shuffle(2, seed=1), 3)
    for t in range(6):
        p = s.partition(t, 8)
        assert p == Shuffle(2, seed=1).partition(t, 8)
        assert {tuple(s.part(g, t, 8)) for g in p} == {(t % 3, 3)}


def test_fragments_compose_with_a_spread_plan_and_still_mix():
    plan = TopologyAware([[0, 1, 2, 3], [4, 5, 6, 7]], cross_every=4)
    s = Fragments(plan, 2)
    for t in range(8):
        for g in s.partition(t, 8):
            i, n = plan.part(g, t, 8)
            assert s.part(g, t, 8) == (i * 2 + t % 2, n * 2)
    assert spectral_gap(s, 8, steps=64) > 0
    assert s.cycle(8) is None or s.cycle(8) % 2 == 0


def test_bad_fragments_name_the_fix():
    with pytest.raises(UsageError, match="integer >= 1"):
        Fragments(Shuffle(2), 0)


def _run(fragments: int, steps: int):
    torch.set_num_threads(1)
    model = torch.nn.Linear(10, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.arange(10.0) * (dist.get_rank() + 1))
    sync = DSSync(model, Shuffle(2, seed=0), fragments=fragments, broadcast_init=False)
    for _ in range(steps):
        sync.step()
    return model.weight.detach().reshape(-1).clone()


@pytest.mark.timeout(90)
def test_each_step_averages_only_its_fragment():
    got = spawn(_run, 4, args=(3, 4), timeout_s=80)
    xs = [torch.arange(10.0) * (r + 1) for r in range(4)]
    s = Fragments(Shuffle(2, seed=0), 3)
    for t in range(4):
        new = [x.clone() for x in xs]
        for g in s.partition(t, 4):
            sl = part_slice(10, s.part(g, t, 4))
            mean = (xs[g[0]][sl] + xs[g[1]][sl]) / 2
            for r in g:
                new[r][sl] = mean
        xs = new
    for r in range(4):
        assert torch.equal(got[r], xs[r]), r
    assert torch.allclose(sum(got) / 4, torch.arange(10.0) * 2.5)  # the mean is kept
    assert group_of(s.partition(0, 4), 0) != [0]
