"""What `train` and `compare` make of their options: one TrainConfig from the shared options,
defaults that are each workload's own settings, and compare's short default method list."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import dssync.lab.cli.compare_cmd as compare_cmd
import dssync.lab.cli.train_cmd as train_cmd
from dssync.errors import UsageError
from dssync.lab.cli import cli
from dssync.lab.methods import DEFAULT_METHODS, method_names
from dssync.lab.train import TrainConfig
from dssync.lab.workloads import WORKLOADS


class Stop(Exception):
    """Raised by the stand-in for training, once the command has built its config."""


@pytest.fixture
def seen(monkeypatch) -> dict:
    """The config `train` would run and the base config and methods `compare` would run."""
    got: dict = {}

    def run_training(cfg, workers):
        got.update(cfg=cfg, workers=workers)
        raise Stop

    def compare(base, methods, seeds, runner, on_run=None, on_fail=None):
        got.update(cfg=base, methods=methods, seeds=seeds)
        raise Stop

    monkeypatch.setattr(train_cmd, "run_training", run_training)
    monkeypatch.setattr(compare_cmd, "compare", compare)
    return got


def _invoke(args: list[str], tmp_path=None) -> str:
    if args[0] == "compare":
        args = [*args, "--out", str(tmp_path or "unused")]
    r = CliRunner().invoke(cli, args)
    assert isinstance(r.exception, Stop), (r.output, r.exception)
    return r.output


SETTINGS = [
    "--workload-option",
    "hidden=8",
    "--workload-option",
    "depth = 16",
    "--eval-every",
    "5",
    "--bucket-mb",
    "1.5",
    "--every",
    "3",
    "--outer",
    "nesterov",
    "--outer-lr",
    "0.5",
    "--replan",
    "4",
    "--no-overlap",
    "--powersgd-rank",
    "4",
    "--staleness",
    "0",
    "--swa-start",
    "0.5",
    "--swa-lr",
    "0.01",
    "--lr-schedule",
    "cosine",
    "--epochs",
    "2",
    "--workers",
    "2",
    "--device",
    "cpu",
    "--quiet",
]
EXPECTED = {
    "workload_options": {"hidden": "8", "depth": "16"},
    "eval_every": 5,
    "bucket_mb": 1.5,
    "every": 3,
    "outer": "nesterov",
    "outer_lr": 0.5,
    "replan": 4,
    "overlap": False,
    "powersgd_rank": 4,
    "staleness": 0,
    "swa_start": 0.5,
    "swa_lr": 0.01,
    "lr_schedule": "cosine",
    "epochs": 2,
    "device": "cpu",
    "progress": False,
}


@pytest.mark.parametrize("command", ["train", "compare"])
def test_both_commands_build_the_same_config_from_the_shared_options(seen, command, tmp_path):
    _invoke([command, *SETTINGS], tmp_path)
    assert {k: getattr(seen["cfg"], k) for k in EXPECTED} == EXPECTED
    assert seen.get("workers", 2) == 2


def test_train_own_options_reach_the_config(seen):
    _invoke(["train", "--sync", "powersgd", "--seed", "7", "--average-momentum", "--quiet"])
    cfg = seen["cfg"]
    assert (cfg.sync, cfg.seed, cfg.average_momentum, cfg.checkpoint_every) == (
        "powersgd",
        7,
        True,
        0,
    )
    defaults = TrainConfig()
    assert (cfg.powersgd_rank, cfg.staleness, cfg.bucket_mb, cfg.every, cfg.outer) == (
        defaults.powersgd_rank,
        defaults.staleness,
        defaults.bucket_mb,
        None,  # the method's preset decides
        None,
    )


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_epochs_default_to_the_workload_own(seen, workload):
    _invoke(["train", "--workload", workload, "--quiet"])
    assert seen["cfg"].epochs == WORKLOADS[workload].epochs


def test_workload_defaults_are_the_readme_settings():
    wrn, deepfm, bert, mnist = (WORKLOADS[n] for n in ("wrn", "deepfm", "bert", "mnist"))
    assert (wrn.epochs, wrn.batch_size, wrn.lr_schedule) == (6, 16, "cosine")
    assert (deepfm.epochs, deepfm.batch_size, bert.epochs, mnist.epochs) == (10, 8, 4, 4)


def test_compare_wrn_with_no_options_runs_the_short_list_and_says_swa_is_on(seen, tmp_path):
    out = _invoke(["compare", "--workload", "wrn"], tmp_path)
    cfg = seen["cfg"]
    assert seen["methods"] == list(DEFAULT_METHODS) == ["bsp", "dssync"]
    assert (cfg.epochs, cfg.batch_size, cfg.swa_start) == (6, None, 0.75)  # batch: wrn's 16
    swa = [ln for ln in out.splitlines() if "SWA" in ln]
    assert len(swa) == 1 and "on by default" in swa[0] and swa[0].endswith("(--swa-start)")


def test_compare_all_still_runs_every_method_and_given_swa_is_not_announced(seen, tmp_path):
    out = _invoke(["compare", "--methods", "all", "--swa-start", "0.5"], tmp_path)
    assert seen["methods"] == method_names(variants=False) and seen["cfg"].swa_start == 0.5
    assert "SWA" not in out


def test_bad_workload_option_names_the_form(tmp_path):
    r = CliRunner().invoke(cli, ["train", "--workload-option", "hidden"])
    assert r.exit_code == 2 and "KEY=VALUE" in r.output


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "--methods", "dssync-topo-local:overlap=true"],
        ["train", "--sync", "dssync-topo-local", "--overlap"],
    ],
)
def test_overlap_with_a_presets_replan_is_refused_before_any_worker_starts(seen, args, tmp_path):
    if args[0] == "compare":
        args = [*args, "--out", str(tmp_path)]
    r = CliRunner().invoke(cli, args)
    assert isinstance(r.exception, UsageError) and not seen, r.output
    assert "replan=8" in str(r.exception) and "--replan 0" in str(r.exception)


def test_auto_with_overlap_needs_replan_0(seen):
    r = CliRunner().invoke(cli, ["train", "--sync", "auto", "--overlap"])
    assert isinstance(r.exception, UsageError) and not seen
    assert "--replan 0" in str(r.exception)
    _invoke(["train", "--sync", "auto", "--overlap", "--replan", "0"])
    assert seen["cfg"].overlap and seen["cfg"].replan == 0


def test_runs_in_one_launch_must_share_the_device_and_timeout():
    from dataclasses import replace

    from dssync.lab.train.run import train_series

    cfg = TrainConfig(workload="digits", progress=False)
    with pytest.raises(UsageError, match="timeout_s=120.0; a later run has 30"):
        train_series([cfg, replace(cfg, timeout_s=30)], lambda i, s: None)
