"""Which tests are slow: decided by how long they take, not by the folder they live in.

``make test`` skips the tests marked slow (``-m "not slow"``); ``make test-all`` and CI run
everything. A test is slow when it took more than :data:`SLOW_S` seconds in a measured run
(``pytest --durations=0``); :data:`SLOW` lists them, by node id prefix, with the time measured
on the 2-core development machine (under load from other jobs, so generous). Entries without a
time were slow-by-folder before and were not re-measured here (end-to-end runs, real trainers,
emulated clusters, big models); they start processes or train models, so they stay slow until
measured.

Every run also watches: a test outside the slow tier that takes longer than :data:`SLOW_S` is
named at the end of the run, so the list can follow the measurements.
"""

from __future__ import annotations

import pytest

SLOW_S = 5.0

SLOW = (
    # measured (seconds, one run)
    "tests/bench/test_cluster_bench.py::test_tiny_bench_run",  # 31
    "tests/cli/test_piped_runs.py",  # 15-26 each
    "tests/cli/test_errors.py::test_every_kind_is_classified_the_same_locally_and_in_a_worker",  # 19
    "tests/cli/test_hostile_input.py::test_bad_input_in_a_real_process[corrupted checkpoint]",  # 11
    "tests/cli/test_hostile_input.py::test_bad_input_exits_2_with_one_line[corrupted checkpoint]",  # 8
    "tests/cli/test_hostile_input.py::test_bad_input_exits_2_with_one_line[checkpoint missing",  # 7
    "tests/integrations/test_runnable_examples.py",  # 11-23 each
    "tests/e2e/test_quickstart.py::test_the_quickstart_runs_and_ends_with_one_model",  # 8
    # slow before, not re-measured here
    "tests/e2e/test_accuracy_parity.py",
    "tests/e2e/test_cli_runs.py",
    "tests/e2e/test_torchrun.py",
    "tests/integrations/test_accelerate.py",
    "tests/integrations/test_lightning.py",
    "tests/cluster/test_cluster_cli.py",
    "tests/cluster/test_cluster_losses.py",
    "tests/cluster/test_cluster_netns.py",
    "tests/cluster/test_cluster_workers.py",
    "tests/workloads/",
    "tests/bench/test_sync_cost.py",
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
)

_too_slow: list[tuple[str, float]] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > SLOW_S and "slow" not in report.keywords:
        _too_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter) -> None:
    if _too_slow:
        terminalreporter.write_sep("-", f"quick-tier tests over {SLOW_S:.0f} s (list them in SLOW)")
        for nodeid, seconds in sorted(_too_slow, key=lambda t: -t[1]):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
