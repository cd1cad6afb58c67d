"""The same `dssync train` entry point runs unchanged as one rank per process under torchrun."""

from __future__ import annotations

import json

import pytest
from procs import run

from dssync.lab.launch import free_port


@pytest.mark.timeout(300)
def test_train_under_torchrun(tmp_path):
    out = tmp_path / "run.json"
    cmd = [
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "-m",
        "dssync",
        "train",
        "--workload",
        "digits",
        "--epochs",
        "1",
        "--quiet",
        "--sync",
        "dssync",
        "--json",
        str(out),
    ]
    r = run(cmd, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and len(data["worker_accuracy"]) == 2
    assert data["final_accuracy"] > 0.5
