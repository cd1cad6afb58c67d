"""Faults where they hurt: a rank dies before sending, dies inside a collective, or is slowed
inside one. Every survivor must raise within the collective timeout (plus start-up slack), and its
error should be a SyncError naming the faulty rank.

The faulty rank leaves with exit code 0 so that :func:`dssync.lab.launch.spawn` keeps waiting for the
survivors' own errors (a non-zero exit would make it stop them at once); spawn still kills every
process when anything fails or its deadline passes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from faults import DieBeforeSending, InsideCollective

from dssync.lab.launch import WorkerError, class_names, spawn
from dssync.lab.train import TrainConfig, train_worker

TIMEOUT_S = 6.0
WORLD = 4
FAULTY = 1


def _note(folder: str, rank: int, data: dict) -> None:
    Path(folder, f"rank{rank}.json").write_text(json.dumps(data))


def _survivor(cfg: TrainConfig, hook, out: str) -> None:
    try:
        train_worker(cfg, hook)
    except Exception as e:
        _note(
            out,
            dist.get_rank(),
            {"raised_at": time.time(), "classes": class_names(e), "message": str(e)},
        )
        raise


HOOKS = {
    "dies before sending": lambda out: DieBeforeSending(FAULTY, 4, exit_code=0, log_dir=out),
    "dies inside a collective": lambda out: InsideCollective(
        FAULTY, 4, "die", exit_code=0, log_dir=out
    ),
    "slowed inside a collective": lambda out: InsideCollective(
        FAULTY, 4, "slow", sleep_s=TIMEOUT_S * 10, log_dir=out
    ),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", list(HOOKS))
def test_survivors_raise_within_the_timeout(tmp_path, fault):
    cfg = TrainConfig(
        workload="digits", epochs=1, max_steps=20, timeout_s=TIMEOUT_S, progress=False
    )
    with pytest.raises(WorkerError):
        spawn(
            _survivor,
            WORLD,
            args=(cfg, HOOKS[fault](str(tmp_path)), str(tmp_path)),
            timeout_s=180,
            collective_timeout_s=TIMEOUT_S,
        )
    faulty = json.loads((tmp_path / f"rank{FAULTY}.json").read_text())
    assert "fault_at" in faulty, f"the fault never happened: rank {FAULTY} said {faulty}"
    fault_at = faulty["fault_at"]
    survivors = [r for r in range(WORLD) if r != FAULTY]
    seen = {
        r: json.loads((tmp_path / f"rank{r}.json").read_text())
        for r in survivors
        if (tmp_path / f"rank{r}.json").exists()
    }
    assert seen, "no survivor raised"
    for r, s in seen.items():
        assert s["raised_at"] - fault_at < TIMEOUT_S + 10, (r, s)
    # The partner of the faulty rank must say which rank it lost, as a SyncError (PeerLost).
    named = [
        s
        for s in seen.values()
        if "dssync.errors.SyncError" in s["classes"] and f"rank {FAULTY}" in s["message"]
    ]
    assert named, (
        "the partner of the lost rank must raise PeerLost naming it; survivors said "
        f"{[s['message'][:120] for s in seen.values()]}"
    )


class _SlowAndKeep(InsideCollective):
    """Rank FAULTY sleeps inside a collective; every rank keeps its strategy for the end."""

    def started(self, rank: int, strategy) -> None:
        self.strategy = strategy
        super().started(rank, strategy)


def _slowed_run(cfg: TrainConfig, hook: _SlowAndKeep) -> tuple[int, str]:
    from dssync.lab.train.summary import model_digest

    summary = train_worker(cfg, hook)
    return summary["steps"], model_digest(hook.strategy.module)


@pytest.mark.timeout(240)
def test_a_rank_stopped_for_less_than_the_timeout_does_not_stop_the_run(tmp_path):
    """A worker stalled (like SIGSTOP) for 4 s inside a collective with timeout_s=30: the others
    wait for it, the run ends normally, and every rank holds the same final model."""
    cfg = TrainConfig(workload="digits", epochs=1, max_steps=20, timeout_s=30, progress=False)
    hook = _SlowAndKeep(FAULTY, 4, "slow", sleep_s=4, log_dir=str(tmp_path))
    out = spawn(_slowed_run, WORLD, args=(cfg, hook), timeout_s=200, collective_timeout_s=30)
    assert (tmp_path / f"rank{FAULTY}.json").exists()  # the stall happened
    assert [steps for steps, _ in out] == [20] * WORLD
    assert len({digest for _, digest in out}) == 1
