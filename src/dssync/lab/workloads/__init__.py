"""Models and data: each workload is one module; :func:`get` builds one by name."""

from __future__ import annotations

from dssync.lab.workloads.base import Workload, shard
from dssync.lab.workloads.bert import BERT
from dssync.lab.workloads.deepfm import DeepFMWorkload
from dssync.lab.workloads.lm import LM
from dssync.lab.workloads.mnist import MNIST, Digits
from dssync.lab.workloads.wrn import WRN

WORKLOADS: dict[str, type[Workload]] = {
    "mnist": MNIST,
    "digits": Digits,
    "wrn": WRN,
    "bert": BERT,
    "deepfm": DeepFMWorkload,
    "lm": LM,
}


def get(name: str, data_dir: str | None = None, **options) -> Workload:
    """Build the workload called ``name`` (one of :data:`WORKLOADS`)."""
    try:
        cls = WORKLOADS[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; choose one of {', '.join(sorted(WORKLOADS))}"
        ) from None
    return cls(data_dir=data_dir, **options)


__all__ = ["WORKLOADS", "Workload", "get", "shard"]
