"""torchft's own DiLoCo and LocalSGD (torchft.local_sgd) as lab methods, on the elastic launcher:
each replica a torchft Manager with a reconfigurable gloo group, the same as elastic DS-Sync's."""

from __future__ import annotations

import pytest
import torch

from dssync.errors import UsageError
from dssync.lab.config import TrainConfig
from dssync.lab.elastic.launch import run_elastic, step_records
from dssync.lab.methods import build_strategy, configure, get_method, is_elastic, parse_methods

TORCHFT = ["torchft-diloco", "torchft-local-sgd"]


def test_the_elastic_methods_are_in_the_one_table_and_refuse_a_fixed_group():
    for name in ["elastic-dssync", *TORCHFT]:
        assert is_elastic(name) and name not in parse_methods("all")  # all: no torchft needed
        assert configure(TrainConfig(sync=name)).every == (1 if name == "elastic-dssync" else 4)
    assert not is_elastic("diloco")
    with pytest.raises(UsageError, match="runs one process per replica on torchft's elastic"):
        build_strategy(TrainConfig(sync="torchft-diloco"), torch.nn.Linear(2, 2), None)
    assert "torchft.local_sgd" in get_method("torchft-diloco").description


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", TORCHFT)
def test_torchfts_method_trains_two_replicas_that_hold_equal_parameters_after_each_sync(
    tmp_path, method
):
    cfg = configure(TrainConfig(workload="digits", sync=method, max_steps=12, progress=False))
    summary = run_elastic(cfg, 2, folder=tmp_path, timeout_s=240, say=lambda line: None)
    assert summary["sync"] == method and summary["elastic"]["finished"] == [0, 1]
    records = step_records(tmp_path)
    digests = {
        (r["replica"], r["step"]): r["params"] for r in records if "step" in r
    }  # one pid per replica: nothing restarted
    for step in range(1, 13):
        same = digests[0, step] == digests[1, step]
        # every=4: torchft averaged after steps 4, 8, 12; between them each replica trains apart
        assert same == (step % 4 == 0), (step, digests[0, step], digests[1, step])
    finals = [r for r in records if r.get("final")]
    assert len(finals) == 2 and finals[0]["sha256"] == finals[1]["sha256"]
    assert summary["final_metric"] > 0.5, summary["final_metric"]
