"""The training loop's door to the method registry (:mod:`dssync.lab.methods`), under its old names."""

from __future__ import annotations

from dssync.lab.methods import build_strategy, choices

# Every name ``--sync`` accepts: the methods and their aliases.
STRATEGIES: tuple[str, ...] = tuple(choices())

__all__ = ["STRATEGIES", "build_strategy"]
