"""What plugs into a training loop: one class per synchronization method, one interface."""

from dssync.strategies.base import Strategy
from dssync.strategies.bsp import BSP
from dssync.strategies.compressed import FP16, PowerSGD
from dssync.strategies.dssync import DSSync
from dssync.strategies.gossip import DPSGD
from dssync.strategies.hierarchical import Hierarchical
from dssync.strategies.local_sgd import LocalSGD, Solo
from dssync.strategies.outer import nesterov
from dssync.strategies.waitless import AsyncDSSync

__all__ = [
    "AsyncDSSync",
    "BSP",
    "DPSGD",
    "DSSync",
    "FP16",
    "Hierarchical",
    "LocalSGD",
    "PowerSGD",
    "Solo",
    "Strategy",
    "nesterov",
]
