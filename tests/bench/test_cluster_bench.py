"""dssync bench: link-rate bounds, recovery measure, and a tiny run on the emulated cluster."""

from __future__ import annotations

import json

import pytest
import torch

from dssync.lab.bench.bounds import lower_bound
from dssync.lab.bench.cluster_worker import device_for
from dssync.lab.bench.timings import percentile, recovery, settle, summarize
from dssync.lab.cli import main
from dssync.lab.cluster import ClusterError, load_cluster, require_root_and_tools
from dssync.lab.experiments.cluster_bench import per_step_floor
from dssync.lab.report.bench import bench_table, losses_table, recovery_table


def _root_reason() -> str | None:
    try:
        require_root_and_tools()
    except ClusterError as exc:
        return str(exc)
    return None


def test_lower_bounds_follow_the_bottleneck():
    m = 40e6
    s2, s3 = load_cluster("s2-inter-rack"), load_cluster("s3-slow-host")
    assert lower_bound(s2, "ddp", m) == pytest.approx(2 * 7 / 8 * m * 8 / 200e6)
    assert lower_bound(s3, "ddp", m) == pytest.approx(2 * 7 / 8 * m * 8 / 100e6)
    assert lower_bound(s2, "dssync-topo", m) < lower_bound(s2, "ddp", m) / 3
    assert lower_bound(s3, "dssync-topo", m) < lower_bound(s3, "ddp", m) / 4


def _timeline(iters: list[float]) -> list[dict]:
    timeline, t = [], 0.0
    for i, v in enumerate(iters):
        t += v
        timeline.append({"step": i, "end": t, "iter_s": v})
    return timeline


def test_recovery_counts_steps_until_a_cycle_is_within_20_percent():
    # contention at steps 10-29: a 30 s stall at its start; after it ends, 3 slow steps
    iters = [1.0] * 10 + [30.0] + [5.0] * 19 + [3.0] * 3 + [1.0] * 17
    timeline = _timeline(iters)
    applied = [(timeline[10]["end"] - 0.1, 100.0), (timeline[30]["end"] - 0.1, 1000.0)]
    out = recovery(timeline, applied, warmup=2, repeat=4)
    assert out["contention_steps"] == [10, 30]
    assert out["pre_contention_iter_s"] == 1.0 == out["post_contention_iter_s"]
    assert out["contention_iter_s"] == 5.0
    # a window of 4 holding the stall is far off; the first without it starts one step later
    assert out["recovery_steps"] == [1, 3]


def test_recovery_a_median_would_hide_the_stall_but_this_does_not():
    iters = [0.5] * 20 + [30.0] + [0.5] * 39 + [0.5] * 40
    timeline = _timeline(iters)
    applied = [(timeline[20]["end"] - 0.1, 100.0), (timeline[60]["end"] - 0.1, 1000.0)]
    out = recovery(timeline, applied, warmup=3, repeat=8)
    assert out["recovery_steps"] == [1, 0]  # was "0 steps": a median window ignored the 30 s step


def test_recovery_of_a_drifting_pace_is_late_and_short_phases_say_nothing():
    iters = [1.0] * 10 + [1.0 + 0.5 * i for i in range(20)] + [1.0] * 10
    timeline = _timeline(iters)
    applied = [(timeline[10]["end"] - 0.1, 100.0), (timeline[30]["end"] - 0.1, 1000.0)]
    on, off = recovery(timeline, applied, warmup=2, repeat=4)["recovery_steps"]
    assert on is not None and on > 5 and off == 0
    assert settle([1.0, 9.0], 4) == (9.0, 1)  # windows of one step: settled on the last
    assert settle([], 4) == (None, None)


def test_tail_is_per_step_slowest_rank_after_warm_up():
    def ranks(per_rank: list[list[float]]) -> list[dict]:
        out = []
        for times in per_rank:
            t, rec = 0.0, []
            for d in times:
                rec.append([t, t + d, d / 2])
                t += d
            out.append({"records": rec})
        return out

    a = [9.0] + [1.0] * 199  # step 0 is warm-up: left out of the tail
    b = [1.0] * 50 + [4.0] + [1.0] * 149
    c = [1.0] * 70 + [2.0] + [1.0] * 129  # 199 steps: p99 is the second slowest
    out = summarize(ranks([a, b, c]), warmup=1)
    assert out["worst_iter_s"] == 4.0 and out["p99_iter_s"] == 2.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


@pytest.mark.root
@pytest.mark.skipif(_root_reason() is not None, reason=_root_reason() or "")
def test_tiny_bench_run(tmp_path):
    out = tmp_path / "bench.json"
    main(
        [
            "bench",
            "--scenario",
            "tiny",
            "--params",
            "50000",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--no-probe",
            "--timeout",
            "120",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "b.png"),
            "--out-dir",
            str(tmp_path / "work"),
            *("--method", "ddp", "--method", "hierarchical", "--method", "dssync"),
            *("--method", "dssync-topo", "--method", "dssync-topo:every=2:wire=int8"),
        ]
    )
    results = json.loads(out.read_text())["results"]["tiny"]
    assert set(results) == {
        "ddp",
        "hierarchical",
        "dssync",
        "dssync-topo",
        "dssync-topo:every=2:wire=int8",
    }
    label = results["dssync-topo:every=2:wire=int8"]["options"]
    assert (label["every"], label["wire"]) == (2, "int8")  # the label's options reached the ranks
    for r in results.values():
        for key in ("sync_time_s", "iter_time_s", "lower_bound_s"):
            assert r[key] > 0, (key, r)
        assert r["max_link_bytes_per_iter"] > 0
        assert r["bytes_counted_from"] in ("warm-up", "launch")
        assert set(r["tbf_drops"]) == set(load_cluster("tiny").link_names())
        assert isinstance(r["tcp_retransmits"], int) and isinstance(r["tcp_timeouts"], int)
    assert (tmp_path / "b.png").stat().st_size > 0


def test_device_choice_of_a_bench_worker(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_for("auto") == torch.device("cpu") == device_for("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert device_for("auto") == torch.device("cuda", 1) == device_for("cuda")


def test_bounds_know_aliases_and_leave_unmodelled_methods_blank():
    s2 = load_cluster("s2-inter-rack")
    assert lower_bound(s2, "bsp", 1e6) == lower_bound(s2, "ddp", 1e6) > 0
    assert lower_bound(s2, "dssync-static", 1e6) is None
    assert (
        bench_table(
            {
                "s2": {
                    "local-sgd": {
                        "iter_time_s": 0.5,
                        "sync_time_s": 0.1,
                        "lower_bound_s": None,
                        "max_link_bytes_per_iter": 1e6,
                    }
                }
            },
            1000,
        ).row_count
        == 2  # the scenario's heading row and the method's
    )


def _width(table) -> int:
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(table)
    return max(len(line) for line in console.export_text().splitlines())


def _steps(times):
    return [{"step": i, "iter_s": t} for i, t in enumerate(times)]


def test_per_step_floor_counts_steps_whose_averaging_outlasts_the_compute():
    c = 0.25
    # Blocking steps: warm-up, then averaging of 0.10 s, 0.50 s (a crossing step), 0.10 s.
    blocking = {"compute_s": c, "timeline": _steps([9.0, c + 0.1, c + 0.5, c + 0.1])}
    # A perfect overlap hides the short averages and pays the long one: 0.25, 0.50, 0.25.
    perfect = {"compute_s": c, "timeline": _steps([9.0, 0.25, 0.50, 0.25])}
    assert per_step_floor(perfect, blocking, warmup=1) == pytest.approx(1.0)
    slow = {"compute_s": c, "timeline": _steps([9.0, 0.30, 0.60, 0.30])}
    assert per_step_floor(slow, blocking, warmup=1) == pytest.approx(1.2)
    # Each run's averaging is its step minus its own compute.
    heavier = {"compute_s": 0.35, "timeline": _steps([9.0, 0.45, 0.85, 0.45])}
    assert per_step_floor(perfect, heavier, warmup=1) == pytest.approx(1.0)
    assert per_step_floor(perfect, blocking, warmup=4) is None  # nothing after warm-up


def test_bench_tables_fit_80_columns():
    row = {
        "iter_time_s": 31.234,
        "sync_time_s": 30.5,
        "p99_iter_s": 45.123,
        "worst_iter_s": 123.456,
        "lower_bound_s": 0.128,
        "step_bound_s": 0.2,
        "max_link_bytes_per_iter": 123.4e6,
        "ratio_to_ddp": 12.34,
        "compute_s": 0.1,
        "exposed_s": 31.1,
        "ratio_to_hidden": 11.1,
        "ratio_to_hidden_per_step": 11.1,
        "pre_contention_iter_s": 0.5,
        "contention_iter_s": 12.345,
        "lower_bound_contended_s": 0.3,
        "post_contention_iter_s": 0.5,
        "recovery_steps": [None, 117],
    }
    results = {
        "s4-dynamic-longer-name": {m: row for m in ("dssync-topo-overlap", "dssync-allreduce")}
    }
    for compute_ms in (0.0, 100.0):
        t = bench_table(results, 4_000_000, compute_ms)
        assert _width(t) <= 80, compute_ms
    step = bench_table(results, 4_000_000).columns[-1]
    assert step.header == "x step" and list(step.cells)[1] == "156.17x"  # 31.234 s / 0.2 s
    t = recovery_table(results)
    assert _width(t) <= 80
    lossy = {
        **row,
        "tbf_drops": {"rack_uplink:0": 1712, "host:0": 3},
        "tcp_retransmits": 2994,
        "tcp_timeouts": 51,
    }
    lt = losses_table({"s4-dynamic-longer-name": {"dssync-topo-overlap": lossy}})
    assert _width(lt) <= 80
    assert [list(lt.columns[i].cells)[1] for i in (1, 2, 3, 4)] == ["1712", "3", "2994", "51"]
    unshaped = {**row, "tbf_drops": {"host:0": 0, "rack_uplink:0": None}}  # no counters read
    lt = losses_table({"s1": {"ddp": unshaped}})
    assert [list(lt.columns[i].cells)[1] for i in (1, 2, 3, 4)] == ["-", "0", "-", "-"]
    assert list(t.columns[-2].cells) == ["never", "never"]
    assert list(t.columns[-1].cells) == ["117", "117"]
    short = {"s4": {"dssync": {**row, "contention_iter_s": None, "recovery_steps": [None, 14]}}}
    t = recovery_table(short)
    assert [list(t.columns[i].cells) for i in (-2, -1)] == [["-"], ["14"]]
    assert (
        recovery_table({"s1": {"ddp": {k: v for k, v in row.items() if "recov" not in k}}}) is None
    )


def test_a_failed_run_is_kept_aside_and_the_bench_goes_on(monkeypatch):
    from contextlib import nullcontext

    from dssync.lab.experiments import cluster_bench

    spec = load_cluster("tiny")

    class Fake:
        def __init__(self, spec):
            self.spec = spec

    def run_method(cluster, method, settings):
        if method == "dssync":
            raise ClusterError("host 1: torchrun exited with code 1 (PeerLost: rank 0 exited)")
        return {"iter_time_s": 1.0, "sync_time_s": 0.5, "compute_s": 0.1}

    monkeypatch.setattr(cluster_bench, "Cluster", lambda s: nullcontext(Fake(s)))
    monkeypatch.setattr(cluster_bench, "run_method", run_method)
    failed: dict = {}
    methods = ["ddp", "dssync", "dssync-topo"]
    settings = cluster_bench.BenchSettings()
    results = cluster_bench.run_bench(
        ["tiny"], methods, settings, log=lambda m: None, failed=failed
    )
    assert set(results[spec.name]) == {"ddp", "dssync-topo"}
    assert "PeerLost" in failed[spec.name]["dssync"]
    assert results[spec.name]["dssync-topo"]["ratio_to_ddp"] == 1.0
    with pytest.raises(ClusterError, match="PeerLost"):  # without a place for failures: raised
        cluster_bench.run_bench(["tiny"], methods, settings, log=lambda m: None)


def test_bench_refuses_an_option_a_method_does_not_take_before_any_cluster(capsys, monkeypatch):
    from dssync.lab.experiments import cluster_bench

    monkeypatch.setattr(cluster_bench, "Cluster", lambda spec: pytest.fail("a cluster was built"))
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--scenario", "tiny", "--method", "ddp:every=4"])
    assert exit_.value.code == 2
    assert "ddp does not take every" in capsys.readouterr().err


def test_the_bound_of_a_compressed_global_average_goes_all_to_all():
    from dssync.lab.bench.bounds import all_to_all, link_loads, ring_allreduce
    from dssync.lab.experiments.cluster_bench import bound_bytes

    m, s2 = 4_000_000, load_cluster("s2-inter-rack")
    fp32 = bound_bytes({"every": 1}, m)
    int8 = bound_bytes({"every": 1, "wire": "int8"}, m)
    assert fp32 == 4 * m and int8 == pytest.approx(m, rel=0.01)  # a quarter of fp32's bytes
    # each member sends 2(k-1)/k of the bytes, as in a ring, but to every member: the uplink
    # between S2's racks of 4 carries 4 buffers each way (2 a stage) where a ring carries 7/4
    everyone = list(range(8))
    up = ("rack_uplink:0", "up")
    assert link_loads(s2, all_to_all(everyone, 1.0))[up] == pytest.approx(4.0)
    assert link_loads(s2, ring_allreduce(everyone, 1.0))[up] == pytest.approx(1.75)
    ring = lower_bound(s2, "diloco", fp32)
    packed = lower_bound(s2, "diloco:wire=int8", int8, compressed=True)
    assert packed == pytest.approx(ring * (4.0 / 1.75) * int8 / fp32)  # 0.57x fp32's ring
    pair = lower_bound(s2, "dssync-topo:wire=int8", int8, compressed=True)
    assert pair == pytest.approx(lower_bound(s2, "dssync-topo:wire=int8", int8))  # pairs: alike
