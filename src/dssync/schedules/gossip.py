"""Gossip graphs as pure functions: the one-peer exponential graph and the ring of D-PSGD.

* :class:`ExpGossip` is a :class:`~dssync.schedules.Schedule` (pairs, run by DS-Sync's averaging
  core): at step t rank i averages with rank i XOR 2^(t mod log2 N). For N a power of 2 the
  log2 N rounds of one cycle give every rank the exact mean (for those N it pairs the same ranks
  as ``Butterfly(2)``; it refuses other sizes instead of falling back to larger groups).
* :func:`ring_peers` and :func:`ring_matrix` describe D-PSGD's static ring: each rank averages
  with its two neighbours, x_i <- (x_{i-1} + x_i + x_{i+1}) / 3, every step.
"""

from __future__ import annotations

import numpy as np

from dssync.errors import UsageError
from dssync.schedules.base import Partition, Schedule


def check_power_of_two(world_size: int) -> None:
    """UsageError naming the sizes that work, unless ``world_size`` is a power of 2."""
    if world_size < 1 or world_size & (world_size - 1):
        below = 1 << (max(world_size, 1).bit_length() - 1)
        raise UsageError(
            f"exp-gossip needs a power-of-2 number of workers (1, 2, 4, 8, 16, ...), got "
            f"{world_size}; use {below} or {below * 2} workers, or DSSync with Shuffle for any size"
        )


class ExpGossip(Schedule):
    """One peer per step on the time-varying exponential graph (N a power of 2).

    Example::

        >>> g = ExpGossip()
        >>> g.partition(0, 4), g.partition(1, 4), g.cycle(4)
        ([[0, 1], [2, 3]], [[0, 2], [1, 3]], 2)
    """

    def partition(self, step: int, world_size: int) -> Partition:
        check_power_of_two(world_size)
        if world_size == 1:
            return [[0]]
        hop = 1 << (step % self.cycle(world_size))
        return [[i, i ^ hop] for i in range(world_size) if i < i ^ hop]

    def cycle(self, world_size: int) -> int | None:
        check_power_of_two(world_size)
        return max(1, world_size.bit_length() - 1)


def ring_peers(rank: int, world_size: int) -> list[int]:
    """The ring neighbours of ``rank`` (sorted, without itself; one peer when there are 2 ranks).

    Example::

        >>> ring_peers(0, 4), ring_peers(1, 2), ring_peers(0, 1)
        ([1, 3], [0], [])
    """
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in 0..{world_size - 1}; pass a rank of the group")
    return sorted({(rank - 1) % world_size, (rank + 1) % world_size} - {rank})


def ring_matrix(world_size: int) -> np.ndarray:
    """D-PSGD's mixing matrix: W[i, j] = 1/(1 + peers) for j = i or a ring neighbour of i.

    Symmetric and doubly stochastic (every rank has the same number of peers), so repeating it
    drives every rank to the mean.

    Example::

        >>> ring_matrix(3)[0].tolist() == [1 / 3, 1 / 3, 1 / 3]
        True
    """
    w = np.zeros((world_size, world_size))
    for i in range(world_size):
        peers = ring_peers(i, world_size)
        w[i, [i, *peers]] = 1.0 / (1 + len(peers))
    return w


class Bipartite(Schedule):
    """Pairs of one active rank (even) and one passive rank (odd), matched afresh every step.

    The pairing wait-avoiding DS-Sync uses (:class:`~dssync.strategies.waitless.AsyncDSSync`):
    actives start every averaging and passives only answer, so no two ranks ever wait on each
    other in a cycle. At step t active ``2a`` pairs with passive ``2 perm_t[a] + 1``, ``perm_t`` a
    random permutation of (seed, t); with an odd world size the last active is alone.

    Example::

        >>> Bipartite(seed=0).partition(0, 4)
        [[0, 1], [2, 3]]
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def partition(self, step: int, world_size: int) -> Partition:
        if world_size < 1:
            raise UsageError(f"world_size={world_size} must be >= 1")
        passives = world_size // 2
        perm = np.random.default_rng([self.seed, step]).permutation(passives).tolist()
        pairs = [[2 * a, 2 * perm[a] + 1] for a in range(passives)]
        return pairs + ([[world_size - 1]] if world_size % 2 else [])
