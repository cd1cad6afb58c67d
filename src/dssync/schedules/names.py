"""Schedules by name, for command lines and config files."""

from __future__ import annotations

from dssync.schedules.base import Schedule
from dssync.schedules.basic import Butterfly, Global, Shuffle, Static

SCHEDULE_NAMES = ("shuffle", "butterfly", "static", "global")


def schedule_from_name(
    name: str, group_size: int = 2, seed: int = 0, repeat: int | None = None, uneven: bool = False
) -> Schedule:
    """Build a schedule from its command-line name."""
    if name == "shuffle":
        return Shuffle(group_size, seed=seed, repeat=repeat, uneven=uneven)
    if name == "butterfly":
        return Butterfly(group_size)
    if name == "static":
        return Static(group_size, uneven=uneven)
    if name == "global":
        return Global()
    raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
