"""The plain schedules: random shuffles, butterfly (grid axes), static groups, one global group."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dssync.errors import UsageError
from dssync.schedules.base import (
    Partition,
    Schedule,
    canonical,
    check_group_size,
    check_partition,
    split_even,
)


class Shuffle(Schedule):
    """A fresh random partition into groups of ``group_size`` at every step.

    With ``repeat=P`` the schedule cycles through P random partitions, so every group it will
    ever use is known (and created) up front. Partitions depend only on (seed, step).
    ``group_size`` must divide the world size unless ``uneven=True``, which accepts groups that
    differ in size by one (3 ranks in pairs: a pair and a rank alone).

    Example::

        >>> s = Shuffle(2, seed=1, repeat=3)
        >>> s.partition(0, 4) == s.partition(3, 4)
        True
    """

    def __init__(
        self, group_size: int = 2, seed: int = 0, repeat: int | None = None, uneven: bool = False
    ) -> None:
        check_group_size(group_size)
        if repeat is not None and (not isinstance(repeat, int) or repeat < 1):
            raise UsageError(f"repeat={repeat!r} must be a positive integer or None (no repeat)")
        self.group_size = group_size
        self.seed = seed
        self.repeat = repeat
        self._uneven = uneven  # not in describe(): it changes no partition it allows

    def partition(self, step: int, world_size: int) -> Partition:
        check_group_size(self.group_size, world_size, self._uneven)
        key = step % self.repeat if self.repeat else step
        order = np.random.default_rng([self.seed, key]).permutation(world_size)
        return split_even(order.tolist(), self.group_size)

    def cycle(self, world_size: int) -> int | None:
        return self.repeat


class Butterfly(Schedule):
    """Groups along one axis of a virtual grid per step, the axes taken in turn.

    Ranks are written in mixed radix with digits of size ``group_size`` (world_size = k**d gives d
    axes of k). At step t the ranks that differ only in digit ``t mod d`` form a group, so d
    consecutive steps give every rank the exact global mean. When world_size is not a power of
    group_size, it is factored into axes no larger than group_size where its prime factors allow
    (a prime factor p > group_size becomes an axis of p): averaging stays exact.

    Example::

        >>> Butterfly(2).partition(0, 4), Butterfly(2).partition(1, 4)
        ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    """

    def __init__(self, group_size: int = 2) -> None:
        check_group_size(group_size)
        self.group_size = group_size

    def axes(self, world_size: int) -> list[int]:
        """The radix of each grid axis; their product is world_size."""
        check_group_size(self.group_size, world_size)
        primes, n, p = [], world_size, 2
        while n > 1:
            while n % p == 0:
                primes.append(p)
                n //= p
            p += 1
        axes: list[int] = []
        for q in sorted(primes, reverse=True):  # first-fit decreasing into axes of <= group_size
            for i, a in enumerate(axes):
                if a * q <= self.group_size:
                    axes[i] = a * q
                    break
            else:
                axes.append(q)
        return sorted(axes, reverse=True) or [1]

    def partition(self, step: int, world_size: int) -> Partition:
        axes = self.axes(world_size)
        axis = step % len(axes)
        stride = int(np.prod(axes[:axis], dtype=np.int64))
        radix = axes[axis]
        groups = []
        for r in range(world_size):
            if (r // stride) % radix == 0:
                groups.append([r + j * stride for j in range(radix)])
        return canonical(groups)

    def cycle(self, world_size: int) -> int | None:
        return len(self.axes(world_size))


class Static(Schedule):
    """The same groups at every step: no shuffle (an ablation; groups never reach consensus).

    ``groups`` is an explicit list of groups, or an int: consecutive blocks of that size (which
    must divide the world size unless ``uneven=True``).

    Example::

        >>> Static([[0, 1], [2, 3]]).partition(5, 4)
        [[0, 1], [2, 3]]
    """

    def __init__(self, groups: Sequence[Sequence[int]] | int = 2, uneven: bool = False) -> None:
        self._uneven = uneven  # not in describe(): it changes no partition it allows
        if isinstance(groups, int):
            check_group_size(groups)
            self.groups: list[list[int]] | int = groups
        else:
            self.groups = canonical(groups)

    def partition(self, step: int, world_size: int) -> Partition:
        if isinstance(self.groups, int):
            check_group_size(self.groups, world_size, self._uneven)
            return split_even(list(range(world_size)), self.groups)
        check_partition(self.groups, world_size)
        return [list(g) for g in self.groups]

    def cycle(self, world_size: int) -> int | None:
        return 1


class Global(Schedule):
    """One group of all ranks at every step: plain global parameter averaging.

    Example::

        >>> Global().partition(0, 3)
        [[0, 1, 2]]
    """

    def partition(self, step: int, world_size: int) -> Partition:
        return [list(range(world_size))]

    def cycle(self, world_size: int) -> int | None:
        return 1


# Up to this world size the default schedule draws fresh pairs at every averaging, as it always
# did; above it, a cycle of peer_bound(N) random pairings (results at <= 16 ranks are unchanged).
FRESH_UP_TO = 16


def peer_bound(world_size: int) -> int:
    """Distinct peers a rank meets at most under :func:`default_schedule` above
    :data:`FRESH_UP_TO` ranks: 2 * ceil(log2(N)), a cycle of that many random pairings (12 at 64
    ranks, 20 at 1,024). On paper (:func:`~dssync.schedules.consensus_error`) it mixes as well as
    fresh pairs: after 48 averagings 1.5e-7 against 4.2e-7 at 64 ranks, 4.8e-7 against 4.9e-7
    at 128."""
    return 2 * math.ceil(math.log2(max(world_size, 2)))


def default_schedule(world_size: int) -> Shuffle:
    """DSSync's schedule when none is given: random pairs (at an odd world size a pair and a
    rank alone), fresh at every averaging up to :data:`FRESH_UP_TO` ranks; above, repeating
    every :func:`peer_bound` averagings, so each rank's set of distinct peers stays bounded (on
    NCCL each peer is a connection with buffers of its own, ``NCCL_BUFFSIZE`` per channel).

    Example::

        >>> default_schedule(64).repeat, default_schedule(8).repeat
        (12, None)
    """
    uneven = world_size % 2 == 1
    if world_size <= FRESH_UP_TO:
        return Shuffle(2, uneven=uneven)
    return Shuffle(2, repeat=peer_bound(world_size), uneven=uneven)
