"""time_to_target: the training seconds of the first evaluation that reached the target."""

from __future__ import annotations

from dssync.report import time_to_target

EVALS = [
    {"time_s": 1.0, "accuracy": 0.5, "loss": 2.0},
    {"time_s": 2.5, "accuracy": 0.8, "loss": 0.9},
    {"time_s": 4.0, "accuracy": 0.7, "loss": 1.1},
    {"time_s": 6.0, "accuracy": 0.9, "loss": 0.4},
]


def test_first_evaluation_at_or_past_the_target_counts():
    assert time_to_target(EVALS, "accuracy", 0.8, higher_is_better=True) == 2.5  # equal reaches it
    assert (
        time_to_target(EVALS, "accuracy", 0.85, higher_is_better=True) == 6.0
    )  # the dip at 4 s does not
    assert time_to_target(EVALS, "accuracy", 0.95, higher_is_better=True) is None


def test_lower_is_better_metrics_count_from_above():
    assert time_to_target(EVALS, "loss", 1.0, higher_is_better=False) == 2.5
    assert time_to_target(EVALS, "loss", 0.1, higher_is_better=False) is None


def test_evaluations_without_the_metric_are_skipped():
    evals = [{"time_s": 1.0}, {"time_s": 2.0, "auc": 0.7}]
    assert time_to_target(evals, "auc", 0.6, higher_is_better=True) == 2.0
    assert time_to_target([], "auc", 0.6, higher_is_better=True) is None
