"""dssync.save / dssync.load: per-rank files that refuse flipped bytes and another rank's file
(the docs' torch.save recipe loaded a flipped byte inside a tensor and averaged it in)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dssync
from dssync.errors import UsageError
from dssync.lab.launch import spawn


def test_a_round_trip_gives_back_the_state(tmp_path):
    state = {"model": {"w": torch.arange(6.0).view(2, 3)}, "sync": {"steps": 4}}
    dssync.save(state, tmp_path / "rank0.pt")
    back = dssync.load(tmp_path / "rank0.pt")
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["sync"] == {"steps": 4}
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "plain torch.save"])
def test_a_damaged_file_is_refused_naming_it(tmp_path, damage):
    path = tmp_path / "rank0.pt"
    w = torch.full((256,), 0.5)
    dssync.save({"model": {"w": w}}, path)
    data = bytearray(path.read_bytes())
    if damage == "flip":  # one byte inside the tensor's data: torch.load would load it
        at = bytes(data).rfind(w.numpy().tobytes()[:64]) + 33
        data[at] ^= 0x40
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-100]))
    else:
        torch.save({"model": {"w": w}}, path)
    with pytest.raises(UsageError, match=str(path)) as info:
        dssync.load(path)
    if damage == "flip":
        assert "sha256 checksum does not match" in str(info.value)


def _other_rank(folder: str):
    rank = dist.get_rank()
    dssync.save({"rank": rank}, f"{folder}/rank{rank}.pt")
    dist.barrier()
    try:
        dssync.load(f"{folder}/rank{1 - rank}.pt")
    except UsageError as e:
        refused = str(e)
    else:
        refused = None
    return refused, dssync.load(f"{folder}/rank{1 - rank}.pt", any_rank=True)["rank"]


def test_another_ranks_file_is_refused_unless_asked_for(tmp_path):
    out = spawn(_other_rank, 2, args=(str(tmp_path),), timeout_s=120)
    assert f"checkpoint {tmp_path}/rank0.pt was saved by rank 0, this is rank 1" in out[1][0]
    assert [o[1] for o in out] == [1, 0]
