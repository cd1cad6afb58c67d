"""What runs experiments: the per-rank training loop and how to launch it."""

from dssync.train.config import TrainConfig
from dssync.train.loop import averaged_copy, train_worker
from dssync.train.run import run_training

__all__ = ["TrainConfig", "averaged_copy", "run_training", "train_worker"]
