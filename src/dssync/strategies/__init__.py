"""What a training script adopts in place of DDP: DS-Sync (every step's groups, or waitless
pairs) and the outer step of local-step training, on one interface."""

from dssync.strategies.base import Strategy
from dssync.strategies.dssync import DSSync
from dssync.strategies.options import Options
from dssync.strategies.outer import nesterov
from dssync.strategies.waitless import AsyncDSSync

__all__ = ["AsyncDSSync", "DSSync", "Options", "Strategy", "nesterov"]
