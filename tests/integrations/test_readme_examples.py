"""The README's Lightning and Accelerate examples, run as printed with the command on their first line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dssync.launch import free_port, run_contained

README = Path(__file__).resolve().parents[2] / "README.md"


def example(name: str) -> tuple[str, list[str]]:
    """The README's ```python block that starts ``# <name>: `<command>```, and that command."""
    for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S):
        first = block.splitlines()[0]
        if first.startswith(f"# {name}:"):
            return block, shlex.split(re.search(r"`([^`]+)`", first).group(1))
    raise AssertionError(f"README.md has no example starting with '# {name}:'")


def _env() -> dict[str, str]:
    """This environment without a launcher's rank variables, with src/ on the path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(README.parent / "src"), env.get("PYTHONPATH", "")])
    return env


def run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; on timeout every process it started is killed."""
    env = _env()
    done = run_contained(cmd, timeout, env=env, cwd=cwd)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def rank_losses(stdout: str) -> dict[int, str]:
    # Not anchored to lines: two ranks' prints can land on one line of the shared pipe.
    return {int(r): loss for r, loss in re.findall(r"rank (\d+): loss (\d+\.\d{6})", stdout)}


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
