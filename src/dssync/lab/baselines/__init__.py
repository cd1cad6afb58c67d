"""The methods DS-Sync is measured against, each behind the lab's training-loop interface
(:class:`~dssync.lab.baselines.protocol.LabStrategy`): DDP (BSP) and its compression hooks, local SGD and the
solo floor, hierarchical all-reduce, D-PSGD and a parameter server."""

from dssync.lab.baselines.bsp import BSP
from dssync.lab.baselines.compressed import FP16, PowerSGD
from dssync.lab.baselines.gossip import DPSGD
from dssync.lab.baselines.hierarchical import Hierarchical
from dssync.lab.baselines.local_sgd import LocalSGD, Solo
from dssync.lab.baselines.ps import ParameterServer

__all__ = [
    "BSP",
    "DPSGD",
    "FP16",
    "Hierarchical",
    "LocalSGD",
    "ParameterServer",
    "PowerSGD",
    "Solo",
]
