"""The options of every command that trains (train, compare), turned into one TrainConfig.

:func:`training_options` adds the shared options to a command and hands the command a finished
``cfg: TrainConfig`` and ``workers`` instead of the options one by one. Every keyword whose name
is a :class:`~dssync.lab.train.TrainConfig` field goes into ``cfg``, the command's own options too
(``train``'s ``--sync`` and ``--seed``), so a new setting is one option here and nothing else.
An option left unset (None) keeps the TrainConfig default; ``--epochs`` unset is the
workload's own (:attr:`dssync.lab.workloads.Workload.epochs`), and ``--quiet`` turns ``progress`` off.

Example::

    @click.command()
    @training_options
    def train(cfg: TrainConfig, workers: int) -> None:
        run_training(cfg, workers)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import click

from dssync.comm.wire import WIRES
from dssync.lab.methods import OPTIONS as PRESET_OPTIONS
from dssync.lab.methods import OUTERS
from dssync.lab.train import TrainConfig
from dssync.lab.train.device import DEVICES
from dssync.lab.train.lr import LR_SCHEDULES
from dssync.lab.workloads import WORKLOADS
from dssync.schedules import SCHEDULE_NAMES

FIELDS = frozenset(f.name for f in fields(TrainConfig))


def key_values(ctx, param, values: tuple[str, ...]) -> dict[str, str]:
    """``("hidden=2048", "depth=16")`` -> ``{"hidden": "2048", "depth": "16"}``."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE; write e.g. hidden=2048")
        out[key.strip()] = value.strip()
    return out


def _by_workload(setting: str) -> str:
    """``bert 4, deepfm 10, ...``: each workload's own value of ``setting``, for --help."""
    return ", ".join(f"{name} {getattr(cls, setting):g}" for name, cls in sorted(WORKLOADS.items()))


# The options of the one DSSync, shared by every command that runs DS-Sync presets (train,
# compare, bench): None leaves each preset's own value.
DSSYNC_OPTIONS = [
    click.option(
        "--every",
        type=click.IntRange(1),
        default=None,
        help="Optimizer steps per averaging (H): DS-Sync presets, diloco and local-sgd (default: "
        "the method's: 1 for DS-Sync, 4 for local-sgd and diloco).",
    ),
    click.option(
        "--outer",
        type=click.Choice(OUTERS),
        default=None,
        help="Outer optimizer on each averaging's pseudo-gradient: nesterov is DiLoCo's "
        "(SGD, momentum 0.9, --outer-lr); auto is nesterov after SGD-family steps and none after "
        "Adam-family ones, where nesterov lost 16-45%% on lm (default: the method's; diloco, "
        "dssync-local and auto's local-step pick: auto).",
    ),
    click.option(
        "--overlap/--no-overlap",
        default=None,
        help="Run each DS-Sync average behind the next steps' compute (default: the method's).",
    ),
    click.option(
        "--wire",
        type=click.Choice(WIRES),
        default=None,
        help="What DS-Sync sends: fp32, or bf16/fp16/int8 with error feedback (default: the "
        "method's, fp32).",
    ),
    click.option(
        "--fragments",
        type=click.IntRange(1),
        default=None,
        help="Average one of this many fragments of the model per DS-Sync averaging, in "
        "rotation (default: the method's, 1: the whole model).",
    ),
    click.option(
        "--replan",
        type=click.IntRange(0),
        default=None,
        help="Averagings between re-plans of a topology-aware DS-Sync plan, 0 for none; also the "
        "plan's longest gap between crossings (default: the method's, 8 for dssync-topo).",
    ),
]

OPTIONS = [
    click.option(
        "--workload",
        type=click.Choice(sorted(WORKLOADS)),
        default="mnist",
        show_default=True,
        help="Model and data.",
    ),
    click.option(
        "--workload-option",
        "workload_options",
        multiple=True,
        callback=key_values,
        metavar="KEY=VALUE",
        help="A workload setting, e.g. hidden=2048 or depth=16 (repeatable).",
    ),
    click.option(
        "--workers",
        type=click.IntRange(1, 64),
        default=4,
        show_default=True,
        help="Local worker processes (ignored under torchrun).",
    ),
    click.option(
        "--group-size",
        type=click.IntRange(1),
        default=None,
        help="Ranks per DS-Sync group (default: 2; --sync auto's local-step pick on racks of "
        "equal hosts: a whole rack).",
    ),
    click.option(
        "--schedule",
        type=click.Choice(SCHEDULE_NAMES),
        default="shuffle",
        show_default=True,
        help="How DS-Sync groups change between steps.",
    ),
    click.option(
        "--repeat",
        type=click.IntRange(1),
        default=None,
        help="Cycle this many shuffled partitions (default: a fresh one every step).",
    ),
    *DSSYNC_OPTIONS,
    click.option(
        "--outer-lr",
        type=click.FloatRange(min=0, min_open=True),
        default=TrainConfig.outer_lr,
        show_default=True,
        help="Learning rate of --outer nesterov.",
    ),
    click.option(
        "--epochs",
        type=click.IntRange(1),
        default=None,
        help=f"Passes over the data (workload default: {_by_workload('epochs')}; "
        "mnist 12 at hidden=2048).",
    ),
    click.option(
        "--batch-size",
        type=click.IntRange(1),
        default=None,
        help=f"Per-worker batch (workload default: {_by_workload('batch_size')}).",
    ),
    click.option(
        "--lr",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help=f"Learning rate (workload default: {_by_workload('lr')}).",
    ),
    click.option(
        "--lr-schedule",
        type=click.Choice(LR_SCHEDULES),
        default=None,
        help="Learning-rate schedule over the run (workload default: cosine for wrn, else constant).",
    ),
    click.option(
        "--eval-every",
        type=click.IntRange(0),
        default=0,
        show_default=True,
        help="Evaluate the averaged model every N steps (0: once per epoch); finer time-to-target.",
    ),
    click.option(
        "--swa-start",
        type=click.FloatRange(0, 1, max_open=True),
        default=None,
        help="Keep a running weight average from this fraction of the run; report the SWA ensemble.",
    ),
    click.option(
        "--swa-lr",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Hold the learning rate at this value while the weights are averaged (default: keep "
        "following --lr-schedule).",
    ),
    click.option(
        "--bucket-mb",
        type=click.FloatRange(min=0, min_open=True),
        default=TrainConfig.bucket_mb,
        show_default=True,
        help="Size of the flat buckets parameters and gradients travel in (MiB).",
    ),
    click.option(
        "--powersgd-rank",
        type=click.IntRange(1),
        default=TrainConfig.powersgd_rank,
        show_default=True,
        help="powersgd: rank of the low-rank gradient approximation.",
    ),
    click.option(
        "--staleness",
        type=click.IntRange(0),
        default=TrainConfig.staleness,
        show_default=True,
        help="SSP: steps the fastest worker may run ahead of the slowest (0 = synchronous).",
    ),
    click.option(
        "--data-dir",
        type=click.Path(),
        default=None,
        help="Local data folder for the workload.",
    ),
    click.option(
        "--device",
        type=click.Choice(DEVICES),
        default="auto",
        show_default=True,
        help="Where to train: auto is CUDA when present (the GPU numbered LOCAL_RANK), else the CPU.",
    ),
    click.option(
        "--timeout",
        "timeout_s",
        type=click.FloatRange(min=1),
        default=TrainConfig.timeout_s,
        show_default=True,
        help="Seconds any collective may wait before the run fails.",
    ),
    click.option(
        "--max-steps", type=click.IntRange(1), default=None, help="Stop after this many steps."
    ),
    click.option(
        "--quiet",
        is_flag=True,
        help="No progress (by default rank 0 shows a bar on a terminal, else a line per tenth of "
        "the run on stderr).",
    ),
]


def config(options: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from option values named like its fields (None keeps the default)."""
    settings = {k: v for k, v in options.items() if v is not None}
    if "epochs" not in settings:
        name = settings.get("workload", TrainConfig.workload)
        try:
            wl = WORKLOADS[name](**settings.get("workload_options", {}))
        except (ValueError, TypeError) as e:
            raise click.UsageError(f"--workload-option for {name}: {e}") from None
        settings["epochs"] = wl.default_epochs()
    return TrainConfig(**settings)


def dssync_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add :data:`DSSYNC_OPTIONS`; call ``f(options={name: value given}, **its own options)``.

    Example::

        @click.command()
        @dssync_options
        def bench(options: dict) -> None: ...  # {"every": 4} after --every 4
    """

    @functools.wraps(f)
    def command(**kwargs: Any) -> Any:
        given = {k: kwargs.pop(k) for k in PRESET_OPTIONS}
        return f(options={k: v for k, v in given.items() if v is not None}, **kwargs)

    for opt in reversed(DSSYNC_OPTIONS):
        command = opt(command)
    return command


def training_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the shared training options; call ``f(cfg=TrainConfig, workers=N, **its own options)``."""

    @functools.wraps(f)
    def command(**kwargs: Any) -> Any:
        settings = {k: kwargs.pop(k) for k in list(kwargs) if k in FIELDS}
        settings["progress"] = not kwargs.pop("quiet")
        return f(cfg=config(settings), **kwargs)

    for opt in reversed(OPTIONS):
        command = opt(command)
    return command
