"""What plugs into a training loop: one class per synchronization method, one interface."""

from dssync.strategies.adaptive import AdaptiveDSSync
from dssync.strategies.base import Strategy
from dssync.strategies.bsp import BSP
from dssync.strategies.compressed import FP16, PowerSGD
from dssync.strategies.dssync import DSSync
from dssync.strategies.gossip import DPSGD
from dssync.strategies.hierarchical import Hierarchical
from dssync.strategies.local_sgd import LocalSGD
from dssync.strategies.overlap import OverlapDSSync, TopoOverlapDSSync
from dssync.strategies.waitless import AsyncDSSync

__all__ = [
    "AdaptiveDSSync",
    "AsyncDSSync",
    "BSP",
    "DPSGD",
    "DSSync",
    "FP16",
    "Hierarchical",
    "LocalSGD",
    "OverlapDSSync",
    "PowerSGD",
    "Strategy",
    "TopoOverlapDSSync",
]
