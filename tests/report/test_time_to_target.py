"""Time to train: the first evaluation at a fixed target, its spread over seeds, the verdicts."""

from __future__ import annotations

import math

import pytest

from dssync.lab.report import time_to_target
from dssync.lab.report.files import band, write_markdown
from dssync.lab.report.summary import compare_pair, reach, summarize, summary_table

EVALS = [
    {"step": 10, "time_s": 1.0, "accuracy": 0.5, "loss": 2.0},
    {"step": 20, "time_s": 2.5, "accuracy": 0.8, "loss": 0.9},
    {"step": 30, "time_s": 4.0, "accuracy": 0.7, "loss": 1.1},
    {"step": 40, "time_s": 6.0, "accuracy": 0.9, "loss": 0.4},
]


def test_first_evaluation_at_or_past_the_target_counts():
    assert time_to_target(EVALS, "accuracy", 0.8, higher_is_better=True) == 2.5  # equal reaches it
    assert (
        time_to_target(EVALS, "accuracy", 0.85, higher_is_better=True) == 6.0
    )  # the dip at 4 s does not
    assert time_to_target(EVALS, "accuracy", 0.95, higher_is_better=True) is None
    assert reach(EVALS, "accuracy", 0.85, True) == {
        "time_s": 6.0,
        "step": 40,
        "averaged_time_s": None,  # results written before the final average was recorded
    }


def test_lower_is_better_metrics_count_from_above():
    assert time_to_target(EVALS, "loss", 1.0, higher_is_better=False) == 2.5
    assert time_to_target(EVALS, "loss", 0.1, higher_is_better=False) is None


def test_evaluations_without_the_metric_are_skipped():
    evals = [{"step": 1, "time_s": 1.0}, {"step": 2, "time_s": 2.0, "auc": 0.7}]
    assert time_to_target(evals, "auc", 0.6, higher_is_better=True) == 2.0
    assert time_to_target([], "auc", 0.6, higher_is_better=True) is None


def _run(seed: int, times: list[float], accs: list[float], final: float | None = None) -> dict:
    evals = [
        {"step": 10 * (i + 1), "time_s": t, "accuracy": a}
        for i, (t, a) in enumerate(zip(times, accs, strict=True))
    ]
    return {
        "config": {"seed": seed},
        "metric_name": "accuracy",
        "higher_is_better": True,
        "final_metric": accs[-1] if final is None else final,
        "evals": evals,
        "steps": 10 * len(times),
        "train_time_s": times[-1],
        "iter_time_s": times[-1] / (10 * len(times)),
        "compute_time_s": 0.01,
        "sync_time_s": 0.02,
        "consensus_distance": 0.0,
        "rank_threads": [1, 1],
    }


def _method(scale: float, reached: int = 3) -> list[dict]:
    """Three seeds whose curves reach 0.9 at 3, 4 and 5 units of time times ``scale``; seeds
    from ``reached`` on stop at 0.85."""
    runs = []
    for seed, k in enumerate((3, 4, 5)):
        accs = [0.5 + 0.4 * min(1.0, (i + 1) / k) for i in range(6)]
        if seed >= reached:
            accs = [min(a, 0.85) for a in accs]
        runs.append(_run(seed, [scale * (i + 1) for i in range(6)], accs))
    return runs


def test_the_summary_gives_median_and_range_of_time_and_steps_and_reaching_seeds():
    s = summarize({"bsp": _method(1.0), "dssync": _method(0.2, reached=2)}, 0.9, "bsp")
    bsp, ds = s["methods"]["bsp"], s["methods"]["dssync"]
    assert bsp["time_to_target"] == {"median": 4.0, "min": 3.0, "max": 5.0}
    assert bsp["steps_to_target_spread"] == {"median": 40, "min": 30, "max": 50}
    assert bsp["seeds_reaching_target"] == 3 and ds["seeds_reaching_target"] == 2
    assert ds["times_to_target_s"][2] is None
    assert ds["time_to_target"]["median"] == pytest.approx(0.7)
    assert bsp["final_metric_range"] == [0.9, 0.9] and bsp["threads"] == [1]


def test_ranges_that_overlap_are_not_a_difference_and_a_missed_seed_is_infinitely_slow():
    fast, slow = summarize({"a": _method(0.2), "b": _method(1.0)}, 0.9)["methods"].values()
    assert compare_pair(fast, slow) == "faster" and compare_pair(slow, fast) == "slower"
    near = summarize({"c": _method(0.9)}, 0.9)["methods"]["c"]
    assert compare_pair(near, slow) == "within the spread"
    missed = summarize({"d": _method(0.2, reached=2)}, 0.9)["methods"]["d"]
    assert compare_pair(missed, slow) == "within the spread"  # its third seed never got there
    assert compare_pair(slow, missed) == "within the spread"


def test_verdicts_name_the_ratio_and_whether_it_is_beyond_the_spread():
    s = summarize({"bsp": _method(1.0), "dssync": _method(0.3), "fp16": _method(0.9)}, 0.9)
    lines = s["verdicts"]
    assert lines[0].startswith("bsp: 4.0 s")
    assert (
        lines[1]
        == "dssync: 0.30x bsp's median time to the target, faster than bsp beyond the spread of the seeds"
    )
    assert "within the spread of bsp's seeds" in lines[2]
    assert lines[-1] == "fastest: dssync, beyond the spread of every other method"


def test_a_workload_without_a_target_reports_no_time_and_no_verdicts():
    s = summarize({"bsp": _method(1.0)}, None)
    assert s["methods"]["bsp"]["time_to_target"] is None and s["verdicts"] == []
    assert "pass --target" in s["target_source"]
    summary_table(s)  # renders without a target


def test_the_band_is_the_median_and_range_of_the_seeds_where_all_have_data():
    runs = [_run(0, [1.0, 2.0, 3.0], [0.2, 0.4, 0.6]), _run(1, [1.5, 2.5, 4.0], [0.3, 0.5, 0.9])]
    xs, med, lo, hi = band(runs, "accuracy", "time_s")
    assert xs == [1.5, 2.0, 2.5, 3.0]  # from where both started to where the first ended
    assert lo[0] == pytest.approx(0.3) and hi[0] == pytest.approx(0.3)  # 0.3 both (interpolated)
    assert med[-1] == pytest.approx((0.6 + (0.5 + 0.4 * 0.5 / 1.5)) / 2)
    assert all(a <= m <= b for a, m, b in zip(lo, med, hi, strict=True))
    assert band([], "accuracy", "time_s") == ([], [], [], [])


def test_the_final_average_is_charged_beside_the_time_to_target(tmp_path):
    charged = _method(0.2)
    for run in charged:  # each evaluation's global average took 0.5 s on the slowest rank
        for e in run["evals"]:
            e["averaged_time_s"] = e["time_s"] + 0.5
    s = summarize({"bsp": _method(1.0), "dssync": charged}, 0.9, source="declared")
    ds = s["methods"]["dssync"]
    assert ds["times_with_average_s"] == pytest.approx([1.1, 1.3, 1.5])
    assert ds["time_with_average"] == pytest.approx({"median": 1.3, "min": 1.1, "max": 1.5})
    assert ds["time_to_target"]["median"] == pytest.approx(0.8)  # the primary figure is unchanged
    assert s["methods"]["bsp"]["time_with_average"] is None  # not recorded in its evaluations
    meta = {"workload": "mnist", "workers": 8, "seeds": [0, 1, 2], "epochs": 4, "where": "here"}
    write_markdown(tmp_path / "s.md", s, meta)
    assert (
        "| dssync | 3/3 | 0.8 (0.6-1.0) | 1.3 (1.1-1.5) | 40 (30-50) |"
        in (tmp_path / "s.md").read_text()
    )


def test_the_markdown_report_carries_ranges_ratios_and_verdicts(tmp_path):
    s = summarize({"bsp": _method(1.0), "dssync": _method(0.2, reached=2)}, 0.9, source="declared")
    meta = {"workload": "mnist", "workers": 8, "seeds": [0, 1, 2], "epochs": 4, "where": "here"}
    write_markdown(tmp_path / "s.md", s, meta)
    text = (tmp_path / "s.md").read_text()
    assert "| bsp | 3/3 | 4.0 (3.0-5.0) | n/a | 40 (30-50) | 1.00 |" in text
    assert "| dssync | 2/3 | 0.7 (0.6-0.8) |" in text
    assert "(1 of 3 seeds never reached it)" in text
    assert not math.isnan(s["methods"]["dssync"]["time_to_target"]["median"])


def test_a_failed_run_counts_as_a_seed_that_never_reached_the_target(tmp_path):
    failed = {
        "dssync": [{"seed": 2, "error": "rank 1 never came"}],
        "x": [{"seed": 0, "error": "e"}],
    }
    s = summarize({"bsp": _method(1.0), "dssync": _method(0.2)[:2], "x": []}, 0.9, failed=failed)
    ds, x = s["methods"]["dssync"], s["methods"]["x"]
    assert ds["seeds"] == [0, 1, 2] and ds["times_to_target_s"][2] is None
    assert ds["seeds_reaching_target"] == 2 and ds["failed"] == failed["dssync"]
    assert compare_pair(ds, s["methods"]["bsp"]) == "within the spread"  # 2 is infinitely slow
    assert "dssync: the run of seed 2 failed: rank 1 never came" in s["verdicts"]
    assert x["seeds_reaching_target"] == 0 and x["final_metric"] is None
    meta = {"workload": "mnist", "workers": 8, "seeds": [0, 1, 2], "epochs": 4, "where": "here"}
    write_markdown(tmp_path / "s.md", s, meta)
    text = (tmp_path / "s.md").read_text()
    assert "| dssync | 2/3 |" in text and "| x | 0/1 | n/a |" in text
    summary_table(s)  # renders a method with no finished run


def test_compare_records_a_failed_run_and_goes_on():
    from dssync.lab.config import TrainConfig
    from dssync.lab.experiments.compare import compare
    from dssync.lab.experiments.runners import RunFailed, Runner

    class Flaky(Runner):
        def run_all(self, cfgs, each):
            for i, cfg in enumerate(cfgs):
                if cfg.sync == "dssync" and cfg.seed == 1:
                    each(i, RunFailed("dssync seed 1: host 3 timed out\nlog tail"))
                else:
                    each(i, {"config": {"seed": cfg.seed}, "sync": cfg.sync})

    seen = []
    out = compare(
        TrainConfig(workload="digits"),
        ["bsp", "dssync"],
        [0, 1],
        Flaky(workers=2),
        on_fail=lambda m, s, e: seen.append((m, s)),
    )
    assert [r["config"]["seed"] for r in out.runs["dssync"]] == [0]
    assert len(out.runs["bsp"]) == 2 and seen == [("dssync", 1)]
    assert out.failed == {"dssync": [{"seed": 1, "error": "dssync seed 1: host 3 timed out"}]}

    class Broken(Flaky):
        def run_all(self, cfgs, each):
            raise ValueError("a bug")

    with pytest.raises(ValueError):  # anything but a failed run still ends the comparison
        compare(TrainConfig(workload="digits"), ["bsp"], [0], Broken(workers=2))


def test_a_target_the_solo_control_reaches_is_called_out_first():
    s = summarize({"bsp": _method(1.0), "solo": _method(0.3, reached=1)}, 0.9)
    first = s["verdicts"][0]
    assert first.startswith("the target does not need synchronization: solo")
    assert "on 1 of 3 seeds" in first and "--target" in first
    quiet = summarize({"bsp": _method(1.0), "solo": _method(0.3, reached=0)}, 0.9)["verdicts"]
    assert not any("does not need" in line for line in quiet)
    assert "solo: no seed reached the target" in quiet


def test_a_race_too_short_or_too_noisy_gets_no_verdict():
    """From outside: a 0.1 s against 0.4 s race on a loaded machine was declared "faster beyond the
    spread"; now it says why it cannot judge."""
    s = summarize({"bsp": _method(0.1), "dssync": _method(0.025)}, 0.9)
    line = s["verdicts"][1]
    assert line.startswith("dssync: 0.25x") and "too short for a verdict" in line
    assert "beyond the spread" not in line and "no verdict: too short" in s["verdicts"][-1]
    noisy = _method(0.3)
    for run, it in zip(noisy, (0.010, 0.011, 0.035), strict=True):
        run["iter_time_s"] = it  # the third seed ran 3.5x slower per iteration
    s = summarize({"bsp": _method(1.0), "dssync": noisy}, 0.9)
    assert "too noisy for a verdict" in s["verdicts"][1] and "10.0-35.0 ms" in s["verdicts"][1]
