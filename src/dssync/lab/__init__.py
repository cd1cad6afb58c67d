"""The laboratory: the ``dssync`` command, its training loop, workloads, baselines, the emulated
cluster, benchmarks, the planner and reports (``pip install 'dssync[lab]'``).

Nothing in the library (``import dssync``: schedules, the averaging core, ``DSSync``,
``AsyncDSSync``, topology detection, errors and the doors) imports from here; this package
builds on the library.

``from dssync.lab import auto``: ``--sync auto`` in a training script (probe, time, plan, and a
configured ``DSSync`` with the reason it was picked).
"""

from __future__ import annotations

from typing import Any

__all__ = ["auto"]


def __getattr__(name: str) -> Any:
    """``from dssync.lab import auto`` (:func:`dssync.lab.train.auto.auto`), imported on first
    use: ``import dssync.lab.launch`` and the like need not load the training loop."""
    if name == "auto":
        from dssync.lab.train.auto import auto

        return auto
    raise AttributeError(f"module 'dssync.lab' has no attribute {name!r}")
