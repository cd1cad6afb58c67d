"""The bench's link-rate bound follows a run's options: wire bytes, local steps, fragments."""

from __future__ import annotations

import pytest

from dssync.lab.bench.bounds import lower_bound
from dssync.lab.cluster import load_cluster
from dssync.lab.experiments.cluster_bench import wire_share


def test_the_share_on_the_wire_is_bytes_over_fp32_over_every_and_fragments():
    assert wire_share({}) == 1.0 and wire_share({"wire": None, "every": None}) == 1.0
    assert wire_share({"wire": "bf16"}) == 0.5
    assert wire_share({"wire": "int8", "every": 4}) == pytest.approx((1024 + 4) / 4096 / 4)
    assert wire_share({"fragments": 4, "every": 2}) == 1 / 8


def test_presets_are_bounded_by_the_plan_they_average_on():
    spec = load_cluster("s2-inter-rack")
    b = {m: lower_bound(spec, m, 16e6) for m in ("bsp", "local-sgd", "diloco", "dssync")}
    assert b["bsp"] == b["local-sgd"] == b["diloco"]  # one ring all-reduce of the whole model
    assert lower_bound(spec, "dssync-local", 16e6) == b["dssync"]  # the same shuffled pairs
    topo = lower_bound(spec, "dssync-topo", 16e6)
    assert lower_bound(spec, "dssync-topo-local:every=16", 16e6) == topo
    assert topo < b["bsp"] / 5  # the plan keeps most bytes off the 200 Mbit/s uplink
    assert lower_bound(spec, "dssync-static", 16e6) is None  # not worked out: no bound shown
