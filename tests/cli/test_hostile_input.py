"""Every way a user can hand `dssync` bad input: exit code 2, one line naming problem and fix,
no traceback, and nothing already on disk damaged (an existing --json file, existing checkpoints).

Each case runs in-process through the CLI's own entry point (``dssync.lab.cli.main``, what the
console script calls), so click's validation is checked without starting an interpreter per
case; a few cases also run as a real process (``python -m dssync``), where the exit code and
stderr are the operating system's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dssync.lab.cli import main
from dssync.lab.launch import run_contained
from dssync.lab.train.checkpoint import write_checkpoint

TRAIN = ["train", "--workload", "digits", "--workers", "2", "--epochs", "1", "--quiet"]
GOOD_HEADER = {
    "world_size": 2,
    "workload": "digits",
    "sync": "dssync",
    "workload_options": {},
    "steps_per_epoch": 44,
}


def dssync(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return run_contained([sys.executable, "-m", "dssync", *args], timeout)


def dssync_in_process(args: list[str], capsys) -> SimpleNamespace:
    """``main(args)`` here: its exit code and what it printed (the console script's path)."""
    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def topology(tmp: Path, body: str) -> str:
    path = tmp / "bad.toml"
    path.write_text(body)
    return str(path)


CLUSTER = "[cluster]\nracks = 2\nhosts_per_rack = 1\nworkers_per_host = 1\n"

# name -> (function of tmp_path giving the CLI arguments, words the one-line message must contain)
CASES = {
    "unknown workload": (
        lambda t: ["train", "--workload", "resnet9000"],
        ["workload", "resnet9000", "one of"],
    ),
    "workers not a number": (
        lambda t: [*TRAIN, "--workers", "four"],
        ["--workers", "four", "--help"],
    ),
    "negative epochs": (lambda t: [*TRAIN, "--epochs", "-3"], ["--epochs", "-3"]),
    "learning rate not a float": (lambda t: [*TRAIN, "--lr", "fast"], ["--lr", "fast"]),
    "unknown sync": (lambda t: [*TRAIN, "--sync", "telepathy"], ["--sync", "telepathy"]),
    "unknown rate schedule": (
        lambda t: [*TRAIN, "--lr-schedule", "linear"],
        ["--lr-schedule", "linear", "cosine"],
    ),
    "swa rate without swa": (
        lambda t: [*TRAIN, "--swa-lr", "0.01"],
        ["--swa-lr", "add --swa-start"],
    ),
    "workload option not KEY=VALUE": (
        lambda t: [*TRAIN, "--workload-option", "hidden"],
        ["--workload-option", "KEY=VALUE", "hidden=2048"],
    ),
    "powersgd rank zero": (lambda t: [*TRAIN, "--powersgd-rank", "0"], ["--powersgd-rank", "0"]),
    "negative staleness": (lambda t: [*TRAIN, "--staleness", "-1"], ["--staleness", "-1"]),
    "group size too large": (
        lambda t: [*TRAIN, "--group-size", "5"],
        ["--group-size 5", "use a group size from 1 to 2"],
    ),
    "device cuda without CUDA": (
        lambda t: [*TRAIN, "--device", "cuda"],
        ["--device cuda", "use --device cpu"],
    ),
    "data dir missing": (
        lambda t: [*TRAIN, "--data-dir", str(t / "nowhere")],
        ["does not exist", "pass the folder"],
    ),
    "data dir in wrong format (cifar)": (
        lambda t: [*TRAIN, "--workload", "wrn", "--data-dir", _junk_cifar(t)],
        ["cannot read the wrn data", "pass a folder in the format"],
    ),
    "data dir in wrong format (criteo)": (
        lambda t: [*TRAIN, "--workload", "deepfm", "--data-dir", _junk_criteo(t)],
        ["train.txt:1", "tab-separated"],
    ),
    "resume without a folder": (lambda t: [*TRAIN, "--resume"], ["--resume", "--checkpoint-dir"]),
    "checkpoint dir is a file": (
        lambda t: [*TRAIN, "--checkpoint-dir", _file(t)],
        ["--checkpoint-dir", "is a file"],
    ),
    "checkpoints without --resume": (
        lambda t: [*TRAIN, "--checkpoint-dir", _ckpt(t, GOOD_HEADER)],
        ["already holds checkpoints", "--resume"],
    ),
    "checkpoint of another model": (
        lambda t: [
            *TRAIN,
            "--resume",
            "--checkpoint-dir",
            _ckpt(t, {**GOOD_HEADER, "workload": "mnist"}),
        ],
        ["workload 'mnist'", "resume with --workload mnist", "new --checkpoint-dir"],
    ),
    "checkpoint missing a rank's file": (
        lambda t: [
            *TRAIN,
            "--resume",
            "--checkpoint-dir",
            _ckpt(t, {**GOOD_HEADER, "world_size": 4}, ranks=3),
        ],
        ["step 10: ranks [0, 1, 2]", "restore the missing files"],
    ),
    "corrupted checkpoint": (
        lambda t: [*TRAIN, "--resume", "--checkpoint-dir", _ckpt(t, GOOD_HEADER, damage=True)],
        ["is damaged", "sha256", "delete it"],
    ),
    "unknown straggler method": (
        lambda t: ["bench-straggler", "--methods", "dssync,carrier-pigeon", "--steps", "5"],
        ["carrier-pigeon", "choose from"],
    ),
    "topology: not TOML": (
        lambda t: ["cluster", "up", topology(t, "racks = = 2")],
        ["not valid TOML"],
    ),
    "topology: missing keys": (
        lambda t: ["cluster", "up", topology(t, 'name = "x"\n')],
        ["missing [cluster]"],
    ),
    "topology: negative rate": (
        lambda t: ["cluster", "up", topology(t, CLUSTER + "host_rate_mbit = -5\n")],
        ["host_rate_mbit", "positive"],
    ),
    "topology: unknown rack": (
        lambda t: [
            "cluster",
            "up",
            topology(
                t,
                CLUSTER
                + 'host_rate_mbit = 100\nrack_uplink_mbit = 50\n[[event]]\nlink = "rack_uplink:7"\nrate_mbit = 10\nat_s = 1\n',
            ),
        ],
        ["rack_uplink:7"],
    ),
    "topology: file missing": (lambda t: ["cluster", "up", str(t / "none.toml")], ["none.toml"]),
    "workload option of the wrong type": (
        lambda t: ["train", "--workload", "bert", "--workload-option", "seq_len=abc"],
        ["--workload-option", "bert", "abc"],
    ),
    "stop at a target nobody declared": (
        lambda t: (
            ["compare", "--workload", "mnist", "--workload-option", "hidden=64"]
            + ["--stop-at-target", "--out", str(t / "r")]
        ),
        ["--stop-at-target", "declares none", "--target"],
    ),
}


def _file(t: Path) -> str:
    (t / "plain-file").write_text("not a folder")
    return str(t / "plain-file")


def _junk_cifar(t: Path) -> str:
    d = t / "cifar" / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (d / name).write_bytes(b"\x80\x04junk that is no pickle")
    return str(t / "cifar")


def _junk_criteo(t: Path) -> str:
    (t / "criteo").mkdir()
    (t / "criteo" / "train.txt").write_text("a b c\n")
    return str(t / "criteo")


def _ckpt(t: Path, header: dict, ranks: int = 2, damage: bool = False) -> str:
    folder = t / "ckpt"
    for rank in range(ranks):
        path = write_checkpoint(folder, rank, 10, header, {"model": {}, "rank": rank})
        if damage:
            data = bytearray(path.read_bytes())
            data[-5] ^= 0xFF
            path.write_bytes(bytes(data))
    return str(folder)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# Raised as a bare ValueError by a module that does not use dssync.errors.UsageError yet: the CLI
# treats it as a bug (traceback, exit 1) until it does.


# Also run as a real process: a click error, a check inside the training setup, a damaged file.
IN_A_PROCESS = ["unknown workload", "group size too large", "corrupted checkpoint"]


def check_bad_input(tmp_path: Path, case: str, run) -> None:
    if case == "device cuda without CUDA" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    make_args, words = CASES[case]
    args = make_args(tmp_path)
    existing = tmp_path / "summary.json"
    existing.write_text('{"kept": true}\n')
    if args[0] in ("train", "bench-straggler"):
        args = [*args, "--json", str(existing)]
    before = _snapshot(tmp_path)
    r = run(args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, f"{case}: exit {r.returncode}\n{r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-2000:]
    errors = [ln for ln in lines if ln.startswith(("error:", "Error:"))]
    assert len(errors) == 1 and errors[0] == lines[-1], r.stderr
    for w in words:
        assert w in errors[0], f"{case}: {w!r} not in {errors[0]!r}"
    assert _snapshot(tmp_path) == before, "a file that was already there changed"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_with_one_line(tmp_path, case, capsys):
    check_bad_input(tmp_path, case, lambda args: dssync_in_process(args, capsys))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", IN_A_PROCESS)
def test_bad_input_in_a_real_process(tmp_path, case):
    check_bad_input(tmp_path, case, dssync)
