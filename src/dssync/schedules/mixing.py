"""Schedules on paper: mixing matrices, their products and spectral gaps."""

from __future__ import annotations

import numpy as np

from dssync.schedules.base import Partition, Schedule, check_partition, coordinate_partition


def mixing_matrix(partition: Partition, world_size: int) -> np.ndarray:
    """The doubly stochastic matrix W with x_next = W @ x for one round of group averaging.

    W[i, j] = 1/|g| when i and j share group g, else 0.
    """
    check_partition(partition, world_size)
    w = np.zeros((world_size, world_size))
    for g in partition:
        w[np.ix_(g, g)] = 1.0 / len(g)
    return w


def product_matrix(schedule: Schedule, world_size: int, start: int, steps: int) -> np.ndarray:
    """W_{start+steps-1} @ ... @ W_{start}: the mixing done by ``steps`` consecutive rounds."""
    p = np.eye(world_size)
    for t in range(start, start + steps):
        p = mixing_matrix(coordinate_partition(schedule, t, world_size), world_size) @ p
    return p


def spectral_gap(schedule: Schedule, world_size: int, steps: int = 64, start: int = 0) -> float:
    """1 - |lambda_2| of the mean mixing matrix over ``steps`` steps from ``start``.

    0 means some ranks never mix (the schedule cannot reach consensus); larger is faster mixing;
    1 means one round of the mean matrix is exact averaging.
    """
    mean = (
        sum(
            mixing_matrix(coordinate_partition(schedule, t, world_size), world_size)
            for t in range(start, start + steps)
        )
        / steps
    )
    eig = np.sort(np.abs(np.linalg.eigvalsh((mean + mean.T) / 2)))[::-1]
    second = eig[1] if world_size > 1 else 0.0
    return float(max(0.0, 1.0 - second))


def consensus_error(schedule: Schedule, world_size: int, steps: int, start: int = 0) -> float:
    """Spectral norm of (product of ``steps`` mixing matrices - J/N); 0 means exact averaging."""
    j = np.full((world_size, world_size), 1.0 / world_size)
    return float(np.linalg.norm(product_matrix(schedule, world_size, start, steps) - j, 2))
