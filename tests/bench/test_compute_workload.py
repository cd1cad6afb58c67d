"""The real-compute workload of ``dssync bench`` and the columns that show what overlap hides."""

from __future__ import annotations

import time

import pytest

from dssync.lab.bench.cluster_worker import Burn
from dssync.lab.report.bench import bench_table


def test_burn_takes_about_the_time_asked():
    assert Burn(0).reps == 0
    burn = Burn(20.0)
    assert burn.reps >= 1
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        burn()
        times.append(time.perf_counter() - t0)
    assert 0.002 < min(times) < 1.0  # about 20 ms; generous for a heavily loaded machine


def test_idle_compute_waits_without_using_the_cpu():
    burn = Burn(30.0, kind="idle")
    assert burn.reps == 0
    wall, cpu = time.perf_counter(), time.process_time()
    burn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 0.03 and cpu < 0.01, (wall, cpu)
    with pytest.raises(ValueError, match="cpu, idle"):
        Burn(1.0, kind="gpu")


def test_table_shows_compute_exposed_and_the_overlap_ratio():
    row = {"sync_time_s": 0.01, "lower_bound_s": None, "max_link_bytes_per_iter": 1e6}
    results = {
        "s1": {
            "dssync": {**row, "iter_time_s": 0.2, "compute_s": 0.1, "exposed_s": 0.1},
            "dssync-overlap": {
                **row,
                "iter_time_s": 0.11,
                "compute_s": 0.1,
                "exposed_s": 0.01,
                "ratio_to_hidden": 1.1,
            },
        }
    }
    t = bench_table(results, 1000, compute_ms=100)
    cols = [c.header for c in t.columns]
    assert {"compute", "exposed", "x max"} <= set(cols)
    exposed = list(t.columns[cols.index("exposed")].cells)
    assert exposed == ["", "0.100", "0.010"]  # the scenario's heading row first
    assert list(t.columns[cols.index("x max")].cells) == ["", "", "1.10x"]
