"""Which tests are slow: whole runs of the CLI, real trainers, emulated clusters, big models.

``make test`` skips them (``-m "not slow"``, a few minutes on 2 cores); ``make ci`` and CI run
everything. A test is slow here by where it lives, so a new end-to-end file is slow by default.
"""

from __future__ import annotations

import pytest

SLOW = (
    "tests/e2e/",
    "tests/integrations/",
    "tests/cluster/",
    "tests/workloads/",
    "tests/cli/",
    "tests/bench/",
    "tests/plan/test_local_cli.py",
    "tests/train/test_elastic_resume.py",
    "tests/train/test_resume.py",
    "tests/train/test_faults.py",
    "tests/train/test_checkpoint_safety.py",
    "tests/strategies/test_overlap_cli.py",
    "tests/strategies/test_overlap.py",
    "tests/comm/test_groups_and_buckets.py::test_no_group_is_created_after_construction",
    "tests/comm/test_router.py",
    "tests/comm/test_groups_and_buckets.py::test_dssync_inside_a_subgroup_averages_only_there",
    "tests/strategies/test_baselines.py::test_train_runs_a_baseline_through_the_registry",
    "tests/strategies/test_ps.py::test_the_fastest_stays_within_s_steps",
    "tests/strategies/test_waitless.py::test_an_active_does_not_wait_for_a_slow_passives_loop",
    "tests/strategies/test_waitless.py::test_a_passive_that_never_answers_is_named",
    "tests/strategies/test_ps.py::test_a_lost_worker_is_named_within_the_timeout",
    "tests/strategies/test_final_state.py::test_every_method_ends_with_one_state_dict",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
