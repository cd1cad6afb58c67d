"""Fragments: any schedule, averaging one fragment of the model per step in rotation.

``Fragments(schedule, 4)`` keeps ``schedule``'s groups and averages, at step ``t``, fragment
``t % 4`` of every flat buffer (a quarter of the bytes), so each coordinate is averaged once
every 4 steps, by the groups of the steps its fragment comes up. It is the one mechanism behind
sliced averaging (:meth:`Schedule.part`, which the averaging core slices by), the same one
``TopologyAware(spread=True)`` uses for its crossings. When the wrapped schedule already slices a
group (a spread crossing), the two compose: slice ``j`` of its ``P`` slices becomes part
``j * F + t % F`` of ``P * F``.

Why it still reaches consensus: at a step, a coordinate whose fragment is not averaged sees the
identity, the others the step's mixing matrix; both are doubly stochastic, so the mean of every
coordinate is kept and each coordinate contracts by the product of its own steps' matrices.

Example::

    >>> from dssync.schedules import Shuffle
    >>> s = Fragments(Shuffle(2, seed=0), 4)
    >>> s.partition(5, 4) == Shuffle(2, seed=0).partition(5, 4), s.part([0, 2], 5, 4)
    (True, (1, 4))
"""

from __future__ import annotations

import math

from dssync.errors import UsageError
from dssync.schedules.base import Group, Part, Partition, Schedule


class Fragments(Schedule):
    """``schedule``'s groups; fragment ``step % fragments`` of the buffers at each step."""

    def __init__(self, schedule: Schedule, fragments: int) -> None:
        if not isinstance(fragments, int) or isinstance(fragments, bool) or fragments < 1:
            raise UsageError(
                f"fragments={fragments!r} must be an integer >= 1 (1 averages the whole model "
                "at every step); try 4"
            )
        self.schedule = schedule
        self.fragments = fragments

    def partition(self, step: int, world_size: int) -> Partition:
        return self.schedule.partition(step, world_size)

    def part(self, group: Group, step: int, world_size: int) -> Part:
        index, parts = self.schedule.part(group, step, world_size)
        return (index * self.fragments + step % self.fragments, parts * self.fragments)

    def cycle(self, world_size: int) -> int | None:
        inner = self.schedule.cycle(world_size)
        return None if inner is None else math.lcm(inner, self.fragments)

    def describe(self) -> str:
        return f"Fragments({self.schedule.describe()}, fragments={self.fragments})"
