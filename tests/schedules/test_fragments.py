"""Fragments: one slice of the model per step, for any schedule; the distributed path against a
one-process reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dssync import DSSync, Shuffle
from dssync.errors import UsageError
from dssync.lab.launch import spawn
from dssync.schedules import Fragments, group_of, plan_topology_aware
from dssync.schedules.base import part_slice
from dssync.topology import Topology


def test_fragments_rotate_and_keep_the_groups():
    s = Fragments(Shuffle(2, seed=1), 3)
    for t in range(6):
        p = s.partition(t, 8)
        assert p == Shuffle(2, seed=1).partition(t, 8)
        assert {tuple(s.part(g, t, 8)) for g in p} == {(t % 3, 3)}


def test_fragments_compose_with_a_spread_plan_and_every_part_crosses():
    racks = Topology(hosts=tuple(range(8)), racks=(0, 0, 0, 0, 1, 1, 1, 1))
    plan = plan_topology_aware(racks, 2, 0, max_every=8)  # crossings spread over 4 slices
    s = Fragments(plan, 4)
    crossing = set()
    for t in range(s.cycle(8)):
        for g in s.partition(t, 8):
            i, n = plan.part(g, t, 8)
            index, parts = s.part(g, t, 8)
            assert parts == n * 4 and index // 4 == i  # slice i of the plan, cut in 4
            if len({r // 4 for r in g}) > 1:
                crossing.add((index, parts))
    assert plan.part([0, 4], 0, 8)[1] > 1  # the plan does slice its crossings
    parts = {p for _, p in crossing}
    assert crossing == {(k, p) for p in parts for k in range(p)}  # every part crosses the racks


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
