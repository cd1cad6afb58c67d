"""What plugs into a training loop: one class per synchronization method, one interface."""

from dssync.strategies.base import Strategy
from dssync.strategies.bsp import BSP
from dssync.strategies.dssync import DSSync

__all__ = ["BSP", "DSSync", "Strategy"]
