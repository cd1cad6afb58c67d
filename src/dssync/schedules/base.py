"""The schedule interface: which ranks average together at each step.

A schedule is pure: every rank computes the same partition from (step, world size) and the
schedule's own settings, with no communication. Groups are sorted lists of ranks; a partition
is a list of disjoint groups, sorted by first rank, that covers every rank exactly once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from dssync import hashing
from dssync.errors import UsageError

Group = list[int]
Partition = list[Group]
Part = tuple[int, int]  # (index, parts): the index-th of ``parts`` equal slices of every buffer
WHOLE: Part = (0, 1)


class Schedule(ABC):
    """Decides the groups of each step. Subclasses implement :meth:`partition`.

    Example::

        >>> from dssync.schedules import Shuffle
        >>> Shuffle(2, seed=0).partition(step=0, world_size=4)
        [[0, 2], [1, 3]]
    """

    UNDESCRIBED: tuple[str, ...] = ()  # attributes that are not settings (see describe)

    @abstractmethod
    def partition(self, step: int, world_size: int) -> Partition:
        """The disjoint groups of ``step`` for ``world_size`` ranks."""

    def part(self, group: Group, step: int, world_size: int) -> Part:
        """Which slice of the averaged tensors ``group`` averages at ``step``: ``(index, parts)``.

        ``(0, 1)`` (the default) is all of them. A schedule may spread a costly group's bytes
        over several steps by averaging one slice at a time (see ``TopologyAware(spread=True)``);
        each coordinate still sees a doubly stochastic mixing matrix at every step.
        """
        return WHOLE

    def cycle(self, world_size: int) -> int | None:
        """Number of steps after which the pattern repeats, or None if it never does.

        A schedule with a cycle has finitely many groups, so all of them can be created up front.
        """
        return None

    def describe(self) -> str:
        """A short text naming the schedule and its settings (used in logs and fingerprints);
        attributes named in ``UNDESCRIBED`` are not settings and are left out."""
        fields = ", ".join(
            f"{k}={v!r}"
            for k, v in sorted(vars(self).items())
            if not k.startswith("_") and k not in self.UNDESCRIBED
        )
        return f"{type(self).__name__}({fields})"

    def fingerprint(self, world_size: int, steps: int = 8) -> int:
        """A 63-bit hash of the settings and the first ``steps`` partitions.

        Ranks compare fingerprints at start-up to catch a schedule that differs across ranks.
        """
        text = self.describe() + repr(
            [
                [(g, self.part(g, s, world_size)) for g in self.partition(s, world_size)]
                for s in range(steps)
            ]
        )
        return hashing.fingerprint(text)

    def __repr__(self) -> str:
        return self.describe()


def check_group_size(group_size: int, world_size: int | None = None, uneven: bool = True) -> None:
    """Raise a UsageError that names the fix when ``group_size`` cannot work.

    Unless ``uneven``, ``group_size`` must divide ``world_size``: a group size that does not would
    silently give some groups fewer members (``Shuffle(3)`` on 4 ranks would be pairs).
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise UsageError(f"group_size={group_size!r} must be an integer >= 1; use 2 for pairs")
    if world_size is not None and group_size > world_size:
        raise UsageError(
            f"group_size={group_size} is larger than world_size={world_size}; "
            f"use a group size from 1 to {world_size}, or Global() for one group of all ranks"
        )
    if world_size is not None and not uneven and world_size % group_size:
        sizes = [k for k in range(1, world_size + 1) if world_size % k == 0]
        raise UsageError(
            f"group_size={group_size} does not divide world_size={world_size}; use "
            f"{', '.join(map(str, sizes[:-1]))} or {sizes[-1]}, or pass uneven=True to accept "
            "groups that differ in size by one"
        )


def split_even(order: Sequence[int], group_size: int) -> Partition:
    """Cut ``order`` into ceil(n / group_size) consecutive groups whose sizes differ by at most one.

    No group is larger than ``group_size``; when it does not divide n, some groups have one member
    fewer (3 ranks with group size 2 give groups of 2 and 1).
    """
    n = len(order)
    n_groups = -(-n // group_size)
    base, extra = divmod(n, n_groups)
    groups, start = [], 0
    for g in range(n_groups):
        size = base + (1 if g < extra else 0)
        groups.append(sorted(order[start : start + size]))
        start += size
    return canonical(groups)


def canonical(groups: Sequence[Sequence[int]]) -> Partition:
    """Sorted members, groups sorted by first member."""
    return sorted((sorted(int(r) for r in g) for g in groups), key=lambda g: g[0])


def check_partition(partition: Partition, world_size: int) -> None:
    """Raise ValueError unless ``partition`` covers ranks 0..world_size-1 exactly once."""
    seen = sorted(r for g in partition for r in g)
    if seen != list(range(world_size)):
        missing = sorted(set(range(world_size)) - set(seen))
        extra = sorted(r for r in set(seen) if seen.count(r) > 1 or not 0 <= r < world_size)
        raise ValueError(
            f"partition {partition} does not cover ranks 0..{world_size - 1} exactly once "
            f"(missing {missing}, repeated or out of range {extra}); give each rank one group"
        )


def group_of(partition: Partition, rank: int) -> Group:
    """The group of ``partition`` that contains ``rank``."""
    for g in partition:
        if rank in g:
            return g
    raise ValueError(f"rank {rank} is in no group of {partition}")


def part_slice(numel: int, part: Part) -> slice:
    """The elements of a flat buffer of ``numel`` elements that ``part`` covers.

    >>> part_slice(10, (1, 4)), part_slice(10, WHOLE)
    (slice(2, 5, None), slice(0, 10, None))
    """
    index, parts = part
    return slice(numel * index // parts, numel * (index + 1) // parts)


def part_fraction(part: Part) -> float:
    """The share of the bytes ``part`` moves."""
    return 1.0 / part[1]


def coordinate_partition(schedule: Schedule, step: int, world_size: int) -> Partition:
    """The partition as the first coordinate of every buffer sees it at ``step``.

    A group that averages another slice leaves that coordinate alone, so its members count as
    singletons; mixing matrices and steps to consensus are those of this partition (every slice
    is mixed alike, shifted in time).
    """
    out: Partition = []
    for g in schedule.partition(step, world_size):
        if schedule.part(g, step, world_size)[0] == 0:
            out.append(g)
        else:
            out += [[r] for r in g]
    return canonical(out)
