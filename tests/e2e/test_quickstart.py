"""examples/quickstart.py (the README shows it) runs as written, on 2 ranks under torchrun, and
leaves both ranks with the same model. (`make gpu-check` runs the same example on CUDA.)"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest

_TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_check.py"
sys.path.insert(0, str(_TOOL.parent))  # importable by name: spawned ranks unpickle its functions
import gpu_check  # noqa: E402

DIGEST = r"rank (\d) model ([0-9a-f]{64}) device (cpu|cuda(?::\d+)?)"


# gloo's abort at process exit (issue 27) is rare since comm/inflight.py, not gone: 0 of 30 runs
# of `tools/exit_aborts.py --runs 30 --load 2 --example library` on 2026-12-07, and once in each of
# the CI runs of 2026-12-06 and 2026-12-07, after the collectives were done. As wheel-check does,
# exactly that abort, after both ranks printed one model, runs the example once more, said aloud as
# a warning; a second abort, or any other failure, fails the test.
ABORT = "terminate called without an active exception"


@pytest.mark.timeout(300)
def test_the_quickstart_runs_and_ends_with_one_model(tmp_path):
    code = gpu_check.library_example()
    assert "loader" in code and "DSSync(" in code and "average_all()" in code
    r = gpu_check.run_example(code, tmp_path, ranks=2, timeout=90)
    found = sorted(re.findall(DIGEST, r.stdout))
    one_model = [f[0] for f in found] == ["0", "1"] and found[0][1] == found[1][1]
    if r.returncode != 0 and ABORT in r.stderr and one_model:
        said = "a rank aborted at exit after both printed one model (issue 27): once more"
        warnings.warn(said, stacklevel=1)
        r = gpu_check.run_example(code, tmp_path, ranks=2, timeout=90)
        found = sorted(re.findall(DIGEST, r.stdout))
    assert r.returncode == 0, r.stderr[-3000:]
    assert [f[0] for f in found] == ["0", "1"], r.stdout + r.stderr[-2000:]
    assert found[0][1] == found[1][1]  # average_all() left both ranks bit-identical


@pytest.mark.timeout(120)
def test_gpu_check_without_cuda_says_so_in_one_line_and_passes():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: `make gpu-check` runs the real checks")
    r = gpu_check.run([gpu_check.sys.executable, str(_TOOL)], timeout=100)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines() == [r.stdout.strip()] and "no CUDA device" in r.stdout


@pytest.mark.timeout(300)
def test_the_gpu_checks_int8_groups_run_on_the_cpu_here():
    """`make gpu-check`'s two-stage int8 check, on CPU tensors: the same code a GPU runs."""
    assert "two-stage" in gpu_check.check_int8_cuda(ranks=4, device_type="cpu")
