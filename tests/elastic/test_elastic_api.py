"""ElasticDSSync's arguments and the quorum's members (that ``import dssync`` leaves torchft
out is checked by tests/test_install_layers.py)."""

from __future__ import annotations

import pytest
import torch

from dssync.elastic import REFUSED, ElasticDSSync, Members, replica_number
from dssync.elastic.group import flatten, unflatten
from dssync.elastic.sync import group_in_quorum
from dssync.errors import UsageError
from dssync.schedules import Shuffle


@pytest.mark.parametrize("option", sorted(REFUSED))
def test_each_option_not_supported_elastically_is_refused_with_its_reason(option):
    value = {"overlap": True, "replan": 8, "wire": "int8", "fragments": 4}.get(option, object())
    with pytest.raises(UsageError, match=f"{option}=.* is not supported elastically: .{{20}}"):
        ElasticDSSync(torch.nn.Linear(2, 2), None, **{option: value})


def test_an_unknown_argument_and_a_plain_manager_are_refused_naming_the_fix():
    with pytest.raises(UsageError, match="unknown arguments \\['group_size'\\]"):
        ElasticDSSync(torch.nn.Linear(2, 2), None, group_size=2)
    with pytest.raises(UsageError, match="pass a dssync.elastic.ReplicaManager"):
        ElasticDSSync(torch.nn.Linear(2, 2), object())


def test_replica_numbers_come_from_the_ids_trailing_digits():
    assert replica_number("replica_12") == 12
    with pytest.raises(UsageError, match="does not end in a number; name replicas replica_0"):
        replica_number("replica_a")


def test_members_map_replica_numbers_to_torchfts_ranks():
    # torchft orders members by replica id as text: replica_10 comes before replica_2
    m = Members(quorum_id=4, rank=2, ranks=(10, 11, 2))
    assert m.replicas == [2, 10, 11]
    assert [m.rank_of(r) for r in m.replicas] == [2, 0, 1]


def test_flatten_and_unflatten_round_trip_mixed_dtypes():
    tensors = [torch.randn(3, 2), torch.arange(4, dtype=torch.float64), torch.randn(5)]
    flats = flatten(tensors)
    assert [f.dtype for f in flats] == [torch.float32, torch.float64]
    copies = [torch.zeros_like(t) for t in tensors]
    unflatten(flats, copies)
    assert all(torch.equal(a, b) for a, b in zip(tensors, copies, strict=True))


def test_a_quorum_smaller_than_a_group_averages_as_one_and_a_quorum_of_one_alone():
    # Shuffle(2) on one replica raised "group_size=2 is larger than world_size=1" (a replica
    # alone in its quorum, min_replicas=1, crashed instead of training on)
    assert group_in_quorum(Shuffle(2, seed=0, uneven=True), 5, [3], 3) == [3]
    assert group_in_quorum(Shuffle(3, seed=0, uneven=True), 5, [1, 4], 4) == [1, 4]
    pairs = [
        group_in_quorum(Shuffle(2, seed=0, uneven=True), 5, [0, 2, 7, 9], r) for r in (0, 2, 7, 9)
    ]
    assert all(len(g) == 2 and r in g for g, r in zip(pairs, (0, 2, 7, 9), strict=True))
    assert sorted(sum(pairs, [])) == [0, 0, 2, 2, 7, 7, 9, 9]
