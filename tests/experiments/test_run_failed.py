"""A failed run on the cluster is named by the worker's own error, not the launcher's traceback."""

from __future__ import annotations

from dssync.lab.experiments.runners import _cause

LOG = """[rank2]: Traceback (most recent call last):
[rank2]: dssync.errors.PeerLost: the schedule's group average at averaging 20 in group [1, 2]: rank 1 never came
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: dssync.lab.train.worker FAILED
"""


def test_the_cause_is_the_workers_first_error():
    assert (
        _cause(LOG)
        == "PeerLost: the schedule's group average at averaging 20 in group [1, 2]: rank 1 never came"
    )
    assert _cause("torch.distributed.elastic...ChildFailedError: x\n") is None
