"""Gossip graphs: the exponential graph averages exactly in log2 N rounds; the ring mixes to the mean."""

from __future__ import annotations

import numpy as np
import pytest

from dssync.errors import UsageError
from dssync.schedules import (
    ExpGossip,
    check_partition,
    consensus_error,
    mixing_matrix,
    product_matrix,
    ring_matrix,
    ring_peers,
)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_exp_gossip_pairs_i_with_i_xor_a_power_of_two_and_averages_exactly(n):
    g = ExpGossip()
    rounds = n.bit_length() - 1
    assert g.cycle(n) == rounds
    for t in range(2 * rounds):
        p = g.partition(t, n)
        check_partition(p, n)
        assert all(len(pair) == 2 and pair[0] ^ pair[1] == 1 << (t % rounds) for pair in p)
    for start in range(rounds):  # from any step: log2 N consecutive rounds give the exact mean
        assert consensus_error(g, n, rounds, start=start) < 1e-12
        x = np.random.default_rng(start).normal(size=n)
        np.testing.assert_allclose(product_matrix(g, n, start, rounds) @ x, np.full(n, x.mean()))
    if rounds > 1:  # and fewer rounds do not
        assert consensus_error(g, n, rounds - 1) > 0.5


def test_exp_gossip_refuses_sizes_that_are_not_powers_of_two_naming_those_that_work():
    for n in (3, 6, 12):
        with pytest.raises(UsageError, match=f"power-of-2 number of workers.*got {n}"):
            ExpGossip().partition(0, n)
    with pytest.raises(UsageError, match="use 4 or 8 workers"):
        ExpGossip().cycle(6)
    assert ExpGossip().partition(5, 1) == [[0]]


def test_ring_peers_are_the_two_neighbours():
    assert ring_peers(0, 4) == [1, 3]
    assert ring_peers(3, 4) == [0, 2]
    assert ring_peers(1, 3) == [0, 2]
    assert ring_peers(0, 2) == [1]
    assert ring_peers(0, 1) == []
    with pytest.raises(UsageError, match="rank 4 is not in 0..3"):
        ring_peers(4, 4)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_ring_matrix_is_doubly_stochastic_and_repeats_to_the_mean(n):
    w = ring_matrix(n)
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    np.testing.assert_allclose(w, w.T)
    for i in range(n):  # nonzero exactly on the rank and its neighbours, each 1/(1 + peers)
        row = [j for j in range(n) if w[i, j] > 0]
        assert row == sorted([i, *ring_peers(i, n)])
        np.testing.assert_allclose(w[i, row], 1.0 / len(row))
    x = np.random.default_rng(n).normal(size=n)
    mixed = np.linalg.matrix_power(w, 200) @ x
    np.testing.assert_allclose(mixed, np.full(n, x.mean()), atol=1e-8)
    if n >= 4:  # one round is not exact: gossip on a ring, unlike the exponential graph
        assert np.abs(w @ x - x.mean()).max() > 1e-3


def test_ring_of_three_is_one_round_of_global_averaging():
    np.testing.assert_allclose(ring_matrix(3), mixing_matrix([[0, 1, 2]], 3))
