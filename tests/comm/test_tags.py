"""Tag kinds: one enum, one number and one name each."""

from __future__ import annotations

from dssync.comm.tags import Kind, Tag


def test_every_kind_has_its_own_number_and_name():
    assert len({int(k) for k in Kind}) == len(Kind)
    assert len({k.describe() for k in Kind}) == len(Kind)
    assert Tag(Kind.OVERLAP, 1, 0).describe() == "an overlapped average at averaging 1"
    assert Tag(Kind.PROBE, 1, 0).describe() == "the bandwidth probe #1"
