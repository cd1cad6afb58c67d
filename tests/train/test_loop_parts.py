"""The training loop's small named pieces, each on its own (no process group needed)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dssync.errors import PeerLost, SyncError, UsageError
from dssync.lab.config import TrainConfig
from dssync.lab.train.data import epoch_batches, steps_per_epoch
from dssync.lab.train.device import Clock, backend_for, resolve_device, to_device
from dssync.lab.train.loop import (
    LOST_PEER_ERRORS,
    checkpoint_due,
    evaluation_due,
    lost_peer,
    warm_up,
)


class _Pair:
    def current_group(self):
        return [2, 3]


@pytest.mark.parametrize("error", LOST_PEER_ERRORS)
def test_a_lost_peer_is_named_from_torch_error_types(monkeypatch, error):
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    e = lost_peer(error("whatever the text says"), _Pair(), rank=2, step=7)
    assert isinstance(e, PeerLost) and e.step == 7 and e.group == [2, 3] and e.ranks == [3]
    assert "rank 2 lost contact with rank 3 at step 7" in str(e) and "\n" not in str(e)


def test_a_sync_error_passes_through():
    e = SyncError("ranks disagree", step=3)
    assert lost_peer(e, _Pair(), rank=0, step=3) is e


def test_evaluation_and_checkpoints_fall_on_epoch_ends_by_default():
    cfg = TrainConfig()
    assert [s for s in range(1, 26) if evaluation_due(cfg, s, 10, 25)] == [10, 20, 25]
    assert [s for s in range(1, 26) if checkpoint_due(cfg, s, 10, 25)] == [10, 20, 25]
    cfg = TrainConfig(eval_every=4, checkpoint_every=6)
    assert [s for s in range(1, 14) if evaluation_due(cfg, s, 10, 13)] == [4, 8, 12]
    assert [s for s in range(1, 14) if checkpoint_due(cfg, s, 10, 13)] == [6, 12, 13]


def test_batches_are_a_pure_function_of_the_seed_and_resume_mid_epoch():
    whole = epoch_batches(100, 8, 12, 0, seed=5)
    assert epoch_batches(100, 8, 12, 7, seed=5) == whole[7:]
    assert sorted(i for b in whole for i in b) == sorted(set(i for b in whole for i in b))
    assert epoch_batches(100, 8, 12, 0, seed=6) != whole
    with pytest.raises(UsageError, match="use a smaller --batch-size"):
        steps_per_epoch(10, 4, 8)


def test_device_choice_and_placement():
    assert (
        resolve_device("cpu") == torch.device("cpu") and backend_for(torch.device("cpu")) == "gloo"
    )
    with pytest.raises(UsageError, match="use one of auto, cpu, cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(UsageError, match="use --device cpu"):
            resolve_device("cuda")
    batch = (torch.ones(2), [torch.zeros(1)], {"k": torch.ones(1)}, 3)
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved, tuple) and isinstance(moved[1], list) and moved[3] == 3
    clock = Clock(torch.device("cpu"))
    assert clock.now() <= clock.now()


class _Counting:
    """A workload's loss that counts its calls (the model has batch norm and dropout, so its
    forward changes buffers and draws random numbers)."""

    calls = 0

    def loss(self, module, batch):
        self.calls += 1
        x, y = batch
        return torch.nn.functional.cross_entropy(module(x), y)


def test_the_warm_up_leaves_the_model_its_gradients_and_the_random_streams_as_they_were():
    torch.manual_seed(3)
    module = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3)
    )
    batch = (torch.randn(16, 6), torch.randint(0, 3, (16,)))

    def sample():  # as a data loader's iterator does, it draws from the global random stream
        torch.randint(0, 2**31, (1,))
        return batch

    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.get_rng_state()
    wl = _Counting()
    warm_up(wl, module, sample, torch.device("cpu"))
    assert wl.calls == 2  # it ran: two forward and backward passes
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats restored
    assert int(after["1.num_batches_tracked"]) == 0
    assert all(p.grad is None for p in module.parameters())
    assert torch.equal(torch.get_rng_state(), rng)  # the sample's draw and dropout's included
