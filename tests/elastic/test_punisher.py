"""The punisher: a replica SIGKILLed every 12-18 s and restarted, for a run of a minute or more.

The kills are the launcher's own (``run_elastic(..., chaos=Chaos(every_s=15))``, what
``dssync train --elastic --chaos-every 15`` runs); ``run_elastic`` kills every process it
started when it returns or raises, and the pytest timeout bounds the whole.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dssync.lab.config import TrainConfig
from dssync.lab.elastic.launch import Chaos, run_elastic, step_records

TIMEOUT_S = 20.0  # each replica's transfer timeout
STEPS = 12_000  # 70-80 s on a quiet 2-core machine (4 to 5 kills), 3 minutes under load


def config() -> TrainConfig:
    cfg = TrainConfig(
        workload="digits",
        sync="elastic-dssync",
        epochs=400,
        batch_size=8,
        max_steps=STEPS,
        timeout_s=TIMEOUT_S,
        seed=0,
    )
    cfg.progress = False
    return cfg


def run(folder: Path, chaos: Chaos | None) -> dict:
    lines: list[str] = []
    started = time.monotonic()
    summary = run_elastic(
        config(), 3, min_replicas=2, restart_delay_s=2.0, timeout_s=900, folder=folder,
        say=lines.append, chaos=chaos,
    )  # fmt: skip
    print("\n".join(lines))
    print(f"run took {time.monotonic() - started:.0f} s")
    return summary


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_replica_killed_every_15_s_never_restarts_a_survivor_and_ends_on_one_model(tmp_path):
    chaos = Chaos(every_s=15, spread=0.2, seed=0)
    summary = run(tmp_path / "chaos", chaos)
    e = summary["elastic"]
    kills = e["chaos_kills"]
    assert len(kills) >= 3, f"only {len(kills)} kills: the run was too short for the punisher"
    gaps = [b["time"] - a["time"] for a, b in zip(kills, kills[1:], strict=False)]
    assert all(11 <= g <= 25 for g in gaps), gaps  # 12-18 s, plus the supervisor's polling
    rs = step_records(tmp_path / "chaos")
    killed = {k["pid"] for k in kills}
    for n in range(3):
        mine = [r for r in rs if r["replica"] == n and "step" in r]
        pids = list(dict.fromkeys(r["pid"] for r in mine))
        # only a process the punisher killed was ever replaced: no survivor restarted
        assert len([p for p in pids if p not in killed]) <= 1, (n, pids, killed)
        assert pids[:-1] == [p for p in pids[:-1] if p in killed], (n, pids, killed)
        mine_killed = len([k for k in kills if k["replica"] == n])
        # each kill restarted, but a kill at the very end, whose restart the run's end cancels
        assert mine_killed - 1 <= e["restarts"][str(n)] <= mine_killed, (n, e["restarts"])
        for pid in pids:
            times = [r["time"] for r in mine if r["pid"] == pid]
            steps = [r["step"] for r in mine if r["pid"] == pid]
            assert steps == sorted(steps), f"replica {n} (pid {pid}) went back a step"
            gap = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)
            print(f"replica {n} pid {pid}: steps {steps[0]}-{steps[-1]}, longest gap {gap:.2f} s")
            assert gap < TIMEOUT_S, f"replica {n} (pid {pid}) waited {gap:.1f} s between steps"
            if pid not in killed:
                assert steps[-1] == STEPS, f"replica {n} (pid {pid}) stopped at {steps[-1]}"
    assert len(e["finished"]) >= 2
    assert len(set(e["final_model_sha256"].values())) == 1, e["final_model_sha256"]
    calm = run(tmp_path / "calm", None)
    assert calm["elastic"]["chaos_kills"] == [] and sum(calm["elastic"]["restarts"].values()) == 0
    diff = summary["final_metric"] - calm["final_metric"]
    print(
        f"final accuracy: {summary['final_metric']:.4f} with {len(kills)} kills, "
        f"{calm['final_metric']:.4f} without ({100 * diff:+.2f} points)"
    )
    # 359 validation images: a kill changes which replicas average for a few steps, so the
    # final model differs; CI saw 2 images (0.56 points) of difference, this allows 4
    assert abs(diff) <= 4.5 / 359, f"{100 * diff:+.2f} points from the run without faults"
