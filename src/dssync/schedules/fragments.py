"""Fragments: any schedule, averaging one fragment of the model per step in rotation.

``Fragments(schedule, 4)`` keeps ``schedule``'s groups and averages, at step ``t``, fragment
``t % 4`` of every flat buffer (a quarter of the bytes), so each coordinate is averaged once
every 4 steps, by the groups of the steps its fragment comes up. It is the one mechanism behind
sliced averaging (:meth:`Schedule.part`, which the averaging core slices by), the same one
``TopologyAware(spread=True)`` uses for its crossings. When the wrapped schedule already slices a
group (a spread crossing moves slice ``t % P`` of ``P``), the two compose: slice ``j`` becomes
part ``j * F + (t // P) % F`` of ``P * F``, so over ``P * F`` steps every part crosses.

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
        # A slicing schedule rotates its own index with the step (a crossing's slice is
        # step % parts): the fragment then advances once per round of those slices, so every
        # (slice, fragment) pair comes up, instead of the two indices moving in lockstep.
        fragment = (step // parts) % self.fragments
        return (index * self.fragments + fragment, parts * self.fragments)

    def cycle(self, world_size: int) -> int | None:
        inner = self.schedule.cycle(world_size)
        if inner is None:
            return None
        parts = {
            self.schedule.part(g, t, world_size)[1]
            for t in range(inner)
            for g in self.schedule.partition(t, world_size)
        }
        return math.lcm(inner, *(p * self.fragments for p in parts))

    def describe(self) -> str:
        return f"Fragments({self.schedule.describe()}, fragments={self.fragments})"
