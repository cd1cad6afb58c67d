"""Points in every training step where tests and benchmarks can act (inject a crash, a delay).

Production runs pass no hook. A hook is an object handed to :func:`dssync.lab.train.run_training`
(or :func:`dssync.lab.train.train_worker`); with local workers it is pickled to each of them, so its
class must be importable (defined at module level).

Example (a straggler for a benchmark)::

    class Sleep(StepHook):
        def __init__(self, rank, ms):
            self.rank, self.ms = rank, ms

        def before_sync(self, rank, step):
            if rank == self.rank:
                time.sleep(self.ms / 1000)

    run_training(cfg, workers=4, hook=Sleep(0, 20))
"""

from __future__ import annotations

from dssync.strategies import Strategy


class StepHook:
    """Does nothing; subclasses override the points they need. ``step`` counts from 1."""

    def started(self, rank: int, strategy: Strategy) -> None:
        """After the strategy is built and any checkpoint is restored, before the first step."""

    def before_sync(self, rank: int, step: int) -> None:
        """After the backward pass of ``step``, before the strategy's synchronization and the
        optimizer step (inside the timed part of the step)."""

    def after_step(self, rank: int, step: int) -> None:
        """After ``step`` is done, logged and checkpointed."""
