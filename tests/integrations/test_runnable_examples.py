"""The examples in examples/, each run with the command on its first line; every rank must end with
the same model (the README and the docs show them; tests/docs/test_snippets.py keeps the copies
equal). The quickstart runs in tests/e2e/test_quickstart.py and `make wheel-check`."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dssync.lab.launch import free_port, run_contained

ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> tuple[str, list[str]]:
    """examples/<name>, and the command on its first line (``# Run with `<command>```)."""
    code = (ROOT / "examples" / name).read_text()
    return code, shlex.split(re.search(r"`([^`]+)`", code.splitlines()[0]).group(1))


def _env() -> dict[str, str]:
    """This environment without a launcher's rank variables, with src/ on the path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; on timeout every process it started is killed."""
    env = _env()
    done = run_contained(cmd, timeout, env=env, cwd=cwd)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def rank_losses(stdout: str, what: str = "loss") -> dict[int, str]:
    """Each rank's printed figure (``rank R: ... <what> <number>``)."""
    # Not anchored to lines: two ranks' prints can land on one line of the shared pipe.
    found = re.findall(rf"rank (\d+): [^\n]*?{what} (-?\d+\.\d{{6}})", stdout)
    return {int(r): value for r, value in found}


def torchrun(name: str) -> list[str]:
    """The example's torchrun command line, on a free port instead of the default 29500."""
    _, cmd = example(name)
    assert cmd[0] == "torchrun"
    return [sys.executable, "-m", "torch.distributed.run", "--master-port", str(free_port()),
            *cmd[1:-1], str(ROOT / "examples" / cmd[-1])]  # fmt: skip


@pytest.mark.timeout(300)
def test_lightning_example(tmp_path):
    code, cmd = example("train_lightning.py")
    (tmp_path / cmd[1]).write_text(code)
    assert cmd[0] == "python"
    r = run([sys.executable, *cmd[1:]], tmp_path, timeout=280)
    losses = rank_losses(r.stdout)
    assert sorted(losses) == [0, 1] and len(set(losses.values())) == 1, r.stdout
    assert float(losses[0]) < 1.0  # it learned (y has variance 8)


@pytest.mark.timeout(300)
def test_accelerate_example(tmp_path):
    code, cmd = example("train_accelerate.py")
    (tmp_path / cmd[-1]).write_text(code)
    assert cmd[0] == "torchrun"
    # A free port instead of the default 29500, which a concurrent run may hold.
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--master-port",
        str(free_port()),
        *cmd[1:],
    ]
    r = run(launch, tmp_path, timeout=90)  # no retry: an abort at exit fails it (issue 27)
    losses = rank_losses(r.stdout)
    assert sorted(losses) == [0, 1] and len(set(losses.values())) == 1, r.stdout
    assert float(losses[0]) < 1.0


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("name", "figures"),
    [
        ("post_local_sgd.py", ["weight norm"]),
        ("uneven_data.py", ["weight norm"]),
        ("checkpoint.py", ["weight norm"]),
        ("variants.py", ["overlapped, weight norm", "wait-avoiding, weight norm"]),
        ("port_ddp.py", ["weight norm"]),
        ("port_dssync.py", ["weight norm"]),
        ("auto.py", ["weight norm"]),
    ],
)
def test_library_example(tmp_path, name, figures):
    r = run(torchrun(name), tmp_path, timeout=120)
    for what in figures:  # every rank printed it, and the same figure
        found = rank_losses(r.stdout, what)
        assert sorted(found) == [0, 1] and len(set(found.values())) == 1, (what, r.stdout)


@pytest.mark.timeout(300)
def test_sharded_example_ends_with_one_model_on_four_ranks(tmp_path):
    """examples/sharded.py (docs/guide/sharded.md): 2 replicas of 2 FSDP2 shards, DS-Sync
    across, a DCP checkpoint saved and loaded, average_all()."""
    r = run(torchrun("sharded.py"), tmp_path, timeout=280)
    found = rank_losses(r.stdout, "weight norm")
    assert sorted(found) == [0, 1, 2, 3] and len(set(found.values())) == 1, r.stdout


CLIP = "clip_grad_norm_(model.parameters(), 1.0)"


@pytest.mark.timeout(300)
def test_the_port_ends_on_ddps_model_at_two_ranks_without_clipping(tmp_path):
    """docs/guide/porting.md: with AdamW and optimizer=, DS-Sync's pair on two ranks is DDP's step
    (with clipping each rank clips its own gradient, so the two differ a little)."""
    norms = []
    for name in ("port_ddp.py", "port_dssync.py"):
        code, _ = example(name)
        assert code.count(CLIP) == 1, f"{name} no longer clips with {CLIP}"
        (tmp_path / name).write_text(code.replace(CLIP, CLIP.replace("1.0", "1e9")))
        cmd = torchrun(name)
        r = run([*cmd[:-1], str(tmp_path / name)], tmp_path, timeout=120)
        found = rank_losses(r.stdout, "weight norm")
        assert sorted(found) == [0, 1] and len(set(found.values())) == 1, r.stdout
        norms.append(found[0])
    assert norms[0] == norms[1], norms  # the same to six digits
