"""What runs experiments: the per-rank training loop and how to launch it."""

from dssync.train.config import TrainConfig
from dssync.train.hooks import StepHook
from dssync.train.loop import train_worker
from dssync.train.run import run_training
from dssync.train.summary import averaged_copy

__all__ = ["StepHook", "TrainConfig", "averaged_copy", "run_training", "train_worker"]
