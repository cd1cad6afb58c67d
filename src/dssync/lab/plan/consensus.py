"""Steps to consensus of a schedule, from its mixing matrices, without forming N x N products.

A round of group averaging is x <- W x with W the schedule's mixing matrix
(:func:`dssync.schedules.mixing_matrix`). Applying W is a mean per group, O(N), so everything
here works on vectors:

* :func:`expected_gap`: 1 - lambda_2 of the mean of W over one cycle (the spectral gap of the
  expected mixing matrix); Lanczos (scipy's ``eigsh``) on the operator, exact to solver tolerance.
* :func:`consensus_steps`: steps until the disagreement ||x - mean|| shrinks by ``eps``. A
  cycle whose groups leave some ranks apart never gets there (a connectivity check, exact). A
  schedule that averages exactly (butterfly) is caught step by step. Otherwise the rate per cycle
  is the asymptotic one, ||A^m x|| ** (1/m) for the cycle's product A = W_c ... W_1 - J/N and a
  random start x, after m cycles (power iteration: a sampled estimate of the spectral radius);
  steps = cycle * ln(eps) / ln(rate), rounded up. Up to EXACT_UP_TO steps that guess is refined
  to the worst-case count: the smallest t with ||W_t ... W_1 - J/N||_2 <= eps, each norm by
  power iteration on the product (matrix-free, O(N t) per iteration).

Example::

    >>> from dssync.schedules import Butterfly
    >>> consensus_steps(Butterfly(2), 4)
    2
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import LinearOperator, eigsh

from dssync.schedules import Schedule, spectral_gap
from dssync.schedules.base import coordinate_partition

DENSE_UP_TO = 128
EXACT_UP_TO = 512  # rate estimates up to this many steps are refined to the worst-case count  # below this, the dense eigen-solver of dssync.schedules is cheap and exact
NEVER = math.inf


def _labels(schedule: Schedule, world: int, cycle: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per step of the cycle: each rank's group index, and each group's size."""
    out = []
    for t in range(cycle):
        ids = np.empty(world, dtype=np.int64)
        groups = coordinate_partition(schedule, t, world)
        for i, g in enumerate(groups):
            ids[g] = i
        out.append((ids, np.array([len(g) for g in groups], dtype=float)))
    return out


def _mix(x: np.ndarray, ids: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """W x: each rank gets its group's mean."""
    return (np.bincount(ids, weights=x, minlength=len(sizes)) / sizes)[ids]


def connected(steps: list[tuple[np.ndarray, np.ndarray]], world: int) -> bool:
    """Whether the groups of the cycle, taken together, join every rank to every other.

    If they do not, some ranks never hear of the others and no number of steps gives consensus.
    """
    rows, cols = [], []
    for t, (ids, _) in enumerate(steps):
        rows.append(np.arange(world))
        cols.append(world + t * world + ids)  # one node per (step, group)
    graph = coo_matrix(
        (np.ones(world * len(steps)), (np.concatenate(rows), np.concatenate(cols))),
        shape=(world * (1 + len(steps)),) * 2,
    )
    _, labels = connected_components(graph, directed=False)
    return len(set(labels[:world].tolist())) == 1


def cycle_of(schedule: Schedule, world: int, default: int = 8) -> int:
    return schedule.cycle(world) or default


def expected_gap(schedule: Schedule, world: int) -> float:
    """1 - lambda_2 of the mean mixing matrix over one cycle (0: never mixes; 1: exact)."""
    cycle = cycle_of(schedule, world)
    if world <= DENSE_UP_TO:
        return spectral_gap(schedule, world, steps=cycle)
    steps = _labels(schedule, world, cycle)

    def apply(v: np.ndarray) -> np.ndarray:
        v = np.ravel(v)
        v = v - v.mean()
        out = sum(_mix(v, ids, sizes) for ids, sizes in steps) / cycle
        return out - out.mean()

    op = LinearOperator((world, world), matvec=apply, dtype=float)
    top = eigsh(
        op,
        k=1,
        which="LA",
        tol=1e-8,
        return_eigenvectors=False,
        v0=np.random.default_rng(0).standard_normal(world),
    )
    return float(max(0.0, 1.0 - top[0]))


def consensus_steps(
    schedule: Schedule, world: int, eps: float = 1e-3, cycles: int = 400, seed: int = 0
) -> float:
    """Steps until the disagreement is ``eps`` of its start (an int, or inf if it never gets there).

    The count is the worst over the step of the cycle one starts at (disagreement arises at every
    step of training, not only at the first). Exact averaging is found step by step in the first
    cycles; otherwise the asymptotic rate per cycle from ``cycles`` cycles of power iteration
    gives cycle * ln(eps) / ln(rate), refined to the worst-case count up to EXACT_UP_TO steps.
    """
    if world < 2:
        return 0
    cycle = cycle_of(schedule, world)
    steps = _labels(schedule, world, cycle)
    if not connected(steps, world):
        return NEVER
    phases = [steps[p:] + steps[:p] for p in range(cycle)]
    exact = [_exact_within(order, world, 4, seed) for order in phases]
    if all(e is not None for e in exact):
        return max(exact)
    rate_log = _rate_per_cycle(steps, world, cycles, seed)
    if rate_log >= -1e-12:
        return NEVER
    guess = math.ceil(cycle * math.log(eps) / rate_log)
    if guess > EXACT_UP_TO:
        return guess
    return max(worst_case_steps(order, world, eps, guess) for order in phases)


def _exact_within(
    steps: list[tuple[np.ndarray, np.ndarray]], world: int, cycles: int, seed: int
) -> int | None:
    """The step at which a random start reaches the exact mean, if it does within ``cycles``."""
    x = np.random.default_rng(seed).standard_normal(world)
    x -= x.mean()
    start = np.linalg.norm(x)
    for t in range(cycles * len(steps)):
        x = _mix(x, *steps[t % len(steps)])
        if np.linalg.norm(x - x.mean()) <= 1e-12 * start:
            return t + 1
    return None


def _rate_per_cycle(
    steps: list[tuple[np.ndarray, np.ndarray]], world: int, cycles: int, seed: int
) -> float:
    """ln of the asymptotic shrink per cycle of a random start's disagreement (power iteration)."""
    x = np.random.default_rng(seed).standard_normal(world)
    x -= x.mean()
    start = np.linalg.norm(x)
    log_norm, logs = 0.0, []
    for _ in range(cycles):
        for ids, sizes in steps:
            x = _mix(x, ids, sizes)
        x -= x.mean()  # the mean is kept; only rounding error leaves it
        norm = float(np.linalg.norm(x))
        if norm == 0.0:
            return -math.inf
        log_norm += math.log(norm / start)
        logs.append(log_norm)
        x *= start / norm
    half = cycles // 2
    return (logs[-1] - logs[half - 1]) / (cycles - half)  # past the transient


def product_norm(
    steps: list[tuple[np.ndarray, np.ndarray]], t: int, v: np.ndarray, iters: int = 12
) -> tuple[float, np.ndarray]:
    """||W_t ... W_1 - J/N||_2 by power iteration on P^T P (each W is symmetric), from ``v``.

    Returns the norm and the last vector (a warm start for the next t). A lower estimate that
    converges from below; the worst-case start vector, not a sampled one.
    """
    cycle = len(steps)
    norm = 0.0
    for _ in range(iters):
        v = v - v.mean()
        v /= np.linalg.norm(v)
        w = v
        for s in range(t):
            w = _mix(w, *steps[s % cycle])
        norm = float(np.linalg.norm(w - w.mean()))
        for s in reversed(range(t)):
            w = _mix(w, *steps[s % cycle])
        v = w
    return norm, v


def worst_case_steps(
    steps: list[tuple[np.ndarray, np.ndarray]], world: int, eps: float, guess: int
) -> int:
    """The smallest t with ||W_t ... W_1 - J/N|| <= eps, searched from ``guess`` (the norm
    never grows with t, since every ||W - J/N|| <= 1)."""
    v = np.random.default_rng(1).standard_normal(world)
    t = max(1, guess)
    norm, v = product_norm(steps, t, v, iters=30)
    if norm > eps:
        while norm > eps and t < 4 * guess + 16:
            t += 1
            norm, v = product_norm(steps, t, v)
        return t
    while t > 1:
        lower, v = product_norm(steps, t - 1, v)
        if lower > eps:
            break
        t -= 1
    return t
