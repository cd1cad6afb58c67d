"""The top-level names: every user-facing class and function, nothing internal."""

from __future__ import annotations

import dssync
from dssync import errors, schedules, topology


def test_errors_detect_and_the_topology_planner_are_at_the_top():
    assert dssync.PeerLost is errors.PeerLost and issubclass(dssync.PeerLost, dssync.SyncError)
    assert dssync.UsageError is errors.UsageError and dssync.DSSyncError is errors.DSSyncError
    assert dssync.detect is topology.detect
    assert dssync.plan_topology_aware is schedules.plan_topology_aware


def test_internal_schedules_stay_in_their_module():
    assert not hasattr(dssync, "Bipartite") and "Bipartite" not in dssync.__all__
    assert schedules.Bipartite  # AsyncDSSync's schedule, still importable where it lives


def test_all_names_resolve():
    assert all(hasattr(dssync, name) for name in dssync.__all__)
    assert dssync.__version__.count(".") == 2


def test_a_process_group_is_passed_as_process_group_and_group_warns():
    import warnings

    import torch

    from dssync.testing import one_rank

    with one_rank():
        model = torch.nn.Linear(2, 1)
        world = torch.distributed.group.WORLD
        assert dssync.consensus_distance(model, process_group=world) == 0.0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert dssync.consensus_distance(model, group=world) == 0.0
            assert dssync.detect(group=world).hosts == (0,)
        said = [str(w.message) for w in caught if w.category is DeprecationWarning]
        assert any("consensus_distance(process_group=" in s for s in said), said
        assert any("detect(process_group=" in s for s in said), said
