"""Settings of one training run, shared by the CLI, the local launcher and torchrun workers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dssync.comm.wait import DEFAULT_TIMEOUT_S


@dataclass
class TrainConfig:
    """Everything a worker needs to train; the same on every rank.

    ``device`` is ``auto`` (CUDA when present, the GPU chosen by LOCAL_RANK), ``cpu`` or ``cuda``.
    ``powersgd_rank`` is the rank of PowerSGD's low-rank approximation; ``staleness`` is how many
    steps SSP lets the fastest worker run ahead of the slowest (0 is synchronous SGD).
    ``every``, ``replan``, ``overlap`` and ``outer`` are DS-Sync's options (``every`` is also
    local SGD's period); None takes the method's preset (:func:`dssync.lab.methods.configure`).
    ``group_size`` None is pairs (:data:`dssync.lab.methods.GROUP_SIZE`) unless ``--sync auto`` picks another.
    ``outer_lr`` is the rate of ``outer="nesterov"`` (DiLoCo's 0.7).
    ``stop_at`` ends the run at the first evaluation whose metric reaches it (MLPerf Training's
    stop at the target; the workload says whether higher is better).
    Fault injection (a crashing or slow rank) is not a setting: tests and benchmarks pass a
    :class:`dssync.lab.train.hooks.StepHook` to :func:`dssync.lab.train.run_training` instead.

    Example::

        cfg = TrainConfig(workload="digits", sync="dssync", group_size=2, epochs=2)
    """

    workload: str = "mnist"
    sync: str = "dssync"
    schedule: str = "shuffle"
    group_size: int | None = None
    repeat: int | None = None
    every: int | None = None
    replan: int | None = None
    overlap: bool | None = None
    outer: str | None = None
    outer_lr: float = 0.7
    wire: str | None = None
    fragments: int | None = None
    epochs: int = 3
    seed: int = 0
    batch_size: int | None = None
    lr: float | None = None
    lr_schedule: str | None = None
    data_dir: str | None = None
    workload_options: dict[str, Any] = field(default_factory=dict)
    average_momentum: bool = False
    bucket_mb: float = 25.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_steps: int | None = None
    eval_every: int = 0
    stop_at: float | None = None
    swa_start: float | None = None
    swa_lr: float | None = None
    progress: bool = True
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    device: str = "auto"
    powersgd_rank: int = 2
    staleness: int = 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
