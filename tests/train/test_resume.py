"""Stop a run (a worker killed mid-run), resume it, and land on the very same parameters."""

from __future__ import annotations

import pytest
from cli_run import DIGITS, FAULT_CLI, load, run

CKPT = ["--checkpoint-every", "10"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run.json"
    r = run(["train", *DIGITS, "--json", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    return load(out)


def _same_run(a: dict, b: dict) -> None:
    assert b["steps"] == a["steps"]
    assert b["worker_model_sha256"] == a["worker_model_sha256"]  # bit-for-bit, every rank
    assert b["final_loss"] == a["final_loss"] and b["final_metric"] == a["final_metric"]
    timings = ("time_s", "rank_time_s", "averaged_time_s")
    drop_time = [{k: v for k, v in e.items() if k not in timings} for e in a["evals"]]
    assert [{k: v for k, v in e.items() if k not in timings} for e in b["evals"]] == drop_time


@pytest.mark.timeout(240)
def test_killed_worker_is_named_and_resume_is_bit_for_bit(tmp_path, uninterrupted):
    ckpt, out = tmp_path / "ckpt", tmp_path / "run.json"
    crash = [
        FAULT_CLI,
        "train",
        *DIGITS,
        "--checkpoint-dir",
        str(ckpt),
        *CKPT,
        "--resume",
        "--timeout",
        "20",
        "--crash-rank",
        "1",
        "--crash-at-step",
        "25",
        "--json",
        str(out),
    ]
    r = run(crash, module=None)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "rank 1" in last and ("exited" in last or "lost contact" in last), last
    assert not out.exists()
    assert sorted(p.name for p in ckpt.glob("rank*")) == [
        "rank000-step000000010.ckpt",
        "rank000-step000000020.ckpt",
        "rank001-step000000010.ckpt",
        "rank001-step000000020.ckpt",
    ]

    # damage rank 1's newest checkpoint: it is refused by name and both ranks fall back to step 10
    bad = ckpt / "rank001-step000000020.ckpt"
    bad.write_bytes(bad.read_bytes()[:-100])
    r = run(crash, module=None)  # the same command again: the crash marker makes it crash only once
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint {bad} is damaged" in r.stderr and "resuming from step 10" in r.stderr
    resumed = load(out)
    assert resumed["resumed_from"] == 10
    _same_run(uninterrupted, resumed)


@pytest.mark.timeout(300)
def test_torchrun_restarts_the_job_and_it_resumes(tmp_path, uninterrupted):
    """torchrun's elastic agent restarts both workers after one dies; the run loses < one interval."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "run.json"
    r = run(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            FAULT_CLI,
            "train",
            "--workload",
            "digits",
            "--epochs",
            "1",
            "--quiet",
            "--checkpoint-dir",
            str(ckpt),
            *CKPT,
            "--resume",
            "--timeout",
            "20",
            "--crash-rank",
            "1",
            "--crash-at-step",
            "25",
            "--json",
            str(out),
        ],
        timeout=240,
        module="torch.distributed.run",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "failed (exitcode: 3) local_rank: 1" in r.stderr  # the crash happened, once
    resumed = load(out)
    assert resumed["resumed_from"] == 20  # crash after step 25, checkpoints every 10
    assert abs(resumed["final_accuracy"] - uninterrupted["final_accuracy"]) <= 0.02
    _same_run(uninterrupted, resumed)  # and on CPU it is in fact bit-for-bit


@pytest.mark.timeout(240)
def test_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(
    tmp_path, uninterrupted
):
    """SIGKILL in the middle of rank 1's checkpoint of step 20: step 20 is on disk for rank 0
    only (rank 1's bytes sit in a temporary file); the next run resumes from step 10, whole."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "run.json"
    cmd = [FAULT_CLI, "train", *DIGITS, "--checkpoint-dir", str(ckpt), *CKPT, "--resume",
           "--timeout", "20", "--kill-rank", "1", "--kill-writing-step", "20",
           "--json", str(out)]  # fmt: skip
    r = run(cmd, module=None)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (ckpt / ".killed-rank1").exists()  # the kill happened, inside the write
    assert sorted(p.name for p in ckpt.glob("rank*")) == [
        "rank000-step000000010.ckpt",
        "rank000-step000000020.ckpt",
        "rank001-step000000010.ckpt",
    ]
    assert [p.name.startswith(".rank001-step000000020.ckpt.") for p in ckpt.glob("*.tmp")] == [True]
    r = run(cmd, module=None)  # the same command again: the kill happens once per folder
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from step 10" in r.stderr
    resumed = load(out)
    assert resumed["resumed_from"] == 10
    _same_run(uninterrupted, resumed)
