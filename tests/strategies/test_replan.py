"""Re-planning (``DSSync(replan=R)``): every rank switches to the same re-planned schedule at once."""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from dssync import DSSync
from dssync.errors import UsageError
from dssync.lab.launch import spawn
from dssync.strategies.replan import adjust_topology, own_stats
from dssync.topology import Topology

TOPO = Topology(
    hosts=(0, 1, 2, 3, 4, 5),
    racks=(0, 0, 0, 1, 1, 1),
    host_mbit={h: 1000.0 for h in range(6)},
    uplink_mbit=1000.0,
)
SLOW_FROM, SLOW_UNTIL = 8, 24  # steps during which crossing the racks is slow


class SlowCrossing(DSSync):
    """Crossing groups take 100 ms longer while the 'uplink' is contended.

    The sleep comes after the average, once the peers' tags have arrived, so it counts as
    transfer; a sleep before the average would be a late partner, which is not timed.
    """

    def _average(self, pg, size, **kwargs):
        group = self.current_group()
        super()._average(pg, size, **kwargs)
        home = self.replanner._home
        if SLOW_FROM <= self.averagings < SLOW_UNTIL and len({home[r] for r in group}) > 1:
            time.sleep(0.1)  # after the tags arrived: transfer time, as on a slow link


def _run(steps: int):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    sync = SlowCrossing(model, topology=TOPO, replan=4)
    sync.replanner.min_signal_s = 0.03
    for _ in range(steps):
        time.sleep(0.002)
        sync.step()
    return sync.switches


def test_all_ranks_switch_at_the_same_step():
    out = spawn(_run, 6, args=(40,), timeout_s=60)
    assert all(s == out[0] for s in out), out
    steps = [step for step, _ in out[0]]
    plans = [desc for _, desc in out[0]]
    assert all("slow=()" in p for p in plans), plans
    assert "cross_every=4" in plans[0] and SLOW_FROM < steps[0] <= SLOW_FROM + 8, out[0]
    # recovered: back to the least gap (max_every // 2 = 2), slices crossing at every step,
    # never the whole model at every step however fast the uplink reads
    assert "cross_every=2" in plans[-1] and SLOW_UNTIL < steps[-1] <= SLOW_UNTIL + 8, out[0]


def _rows(local: float, cross: float, slow_rank: int | None = None, slow_local: float = 0.0):
    rows = []
    for r in range(6):
        loc = slow_local if r == slow_rank else local
        rows.append(own_stats([loc, loc], [cross] if r in (0, 3) else []))
    return np.array(rows)


def test_adjust_topology_finds_slow_uplink_and_host_and_recovers():
    slow_up = adjust_topology(TOPO, _rows(0.1, 1.0))
    assert slow_up.uplink_mbit == 100.0 and slow_up.slow_hosts == ()
    assert adjust_topology(slow_up, _rows(0.1, 0.17)).uplink_mbit == 100.0  # in the band: keep
    assert adjust_topology(slow_up, _rows(0.1, 0.11)).uplink_mbit == 1000.0
    slow_host = adjust_topology(TOPO, _rows(0.1, 0.1, slow_rank=3, slow_local=1.0))
    assert slow_host.slow_hosts == (3,)
    assert adjust_topology(slow_host, _rows(0.1, 0.1, slow_rank=3, slow_local=0.1)).slow_hosts == ()


def test_no_samples_keep_the_estimate():
    assert adjust_topology(TOPO, np.zeros((6, 5))) == TOPO


def _resume(steps: int):
    torch.manual_seed(0)
    sync = SlowCrossing(nn.Linear(4, 2), topology=TOPO, replan=4)
    sync.replanner.min_signal_s = 0.03
    for _ in range(steps):
        time.sleep(0.002)
        sync.step()
    state = sync.state_dict()
    fresh = DSSync(nn.Linear(4, 2), topology=TOPO, replan=4)
    before = fresh.schedule.describe()
    fresh.load_state_dict(state)
    ahead = [sync.schedule.partition(s, 6) for s in range(steps, steps + 8)]
    # A resumed run probes again and reads other rates, here a slow host: its first plan differs,
    # yet it continues on the saved rates' plan.
    probed = TOPO.with_rates({**{h: 1000.0 for h in range(6)}, 5: 100.0}, 900.0)
    again = DSSync(nn.Linear(4, 2), topology=probed, replan=4)
    first_plan = again.schedule.describe()
    again.load_state_dict(state)
    probed_view = (first_plan, again.schedule.describe(), again.switches)
    other = DSSync(nn.Linear(4, 2), topology=TOPO, replan=8)
    try:
        other.load_state_dict(state)
        refused = ""
    except UsageError as e:
        refused = str(e)
    return (
        before,
        sync.schedule.describe(),
        fresh.schedule.describe(),
        ahead,
        fresh.switches,
        [fresh.schedule.partition(s, 6) for s in range(steps, steps + 8)],
        refused,
        probed_view,
    )


def test_a_resumed_run_keeps_its_re_planned_groups():
    for before, planned, resumed, ahead, switches, resumed_ahead, refused, probed in spawn(
        _resume, 6, args=(20,), timeout_s=90
    ):
        assert switches and planned != before  # contention made it re-plan before the save
        assert resumed == planned and resumed_ahead == ahead
        assert "replan=" in refused  # another plan window
        first_plan, continued, _ = probed
        assert first_plan != planned and "slow=(5,)" in first_plan  # the new probe's own plan
        assert continued == planned  # the saved rates' plan, not the new probe's


def _resume_fixed(steps: int):
    torch.manual_seed(0)
    sync = DSSync(
        nn.Linear(4, 2), topology=TOPO, overlap=True
    )  # a fixed plan (dssync-topo-overlap)
    for _ in range(steps):
        sync.step()
    sync.finish()
    state = sync.state_dict()
    planned = sync.schedule.describe()
    ahead = [sync.schedule.partition(s, 6) for s in range(steps, steps + 8)]
    # The resumed run's probe finds host 5 slow: its own first plan differs from the saved one.
    probed = TOPO.with_rates({**{h: 1000.0 for h in range(6)}, 5: 100.0}, 900.0)
    again = DSSync(nn.Linear(4, 2), topology=probed, overlap=True)
    first_plan = again.schedule.describe()
    again.load_state_dict(state)
    continued = [again.schedule.partition(s, 6) for s in range(steps, steps + 8)]
    again.step()  # and it averages on the saved plan's groups with the others
    again.finish()
    moved = Topology(hosts=(0, 1, 2, 3, 4, 5), racks=(0, 0, 1, 1, 1, 1))  # another placement
    try:
        DSSync(nn.Linear(4, 2), topology=moved, overlap=True).load_state_dict(state)
        refused = ""
    except UsageError as e:
        refused = str(e)
    return planned, ahead, first_plan, again.schedule.describe(), continued, refused


def test_a_resumed_fixed_plan_continues_on_its_saved_rates_under_a_new_probe():
    """It used to be refused: the new probe's plan did not match the saved one."""
    for planned, ahead, first_plan, resumed, continued, refused in spawn(
        _resume_fixed, 6, args=(6,), timeout_s=90
    ):
        assert first_plan != planned and "slow=(5,)" in first_plan
        assert resumed == planned and continued == ahead
        assert "checkpoint was written with schedule" in refused  # another placement still is
