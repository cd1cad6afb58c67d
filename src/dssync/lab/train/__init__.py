"""What runs experiments: the per-rank training loop and how to launch it."""

from dssync.lab.config import TrainConfig
from dssync.lab.train.hooks import StepHook
from dssync.lab.train.loop import train_worker
from dssync.lab.train.run import run_training
from dssync.lab.train.summary import averaged_copy

__all__ = ["StepHook", "TrainConfig", "averaged_copy", "run_training", "train_worker"]
