"""dssync: divide-and-shuffle synchronization for data-parallel PyTorch training.

Adopt it in place of DistributedDataParallel::

    sync = dssync.DSSync(model, schedule=dssync.Shuffle(group_size=2))
    ...
    optimizer.step()
    sync.step()          # average parameters inside this step's group

See :class:`dssync.DSSync` for a runnable example.
"""

from dssync.comm import consensus_distance
from dssync.schedules import (
    Butterfly,
    Global,
    Schedule,
    Shuffle,
    Static,
    TopologyAware,
    mixing_matrix,
    spectral_gap,
)
from dssync.strategies import BSP, AdaptiveDSSync, DSSync, Hierarchical, LocalSGD, Strategy

__version__ = "0.1.0"

__all__ = [
    "BSP", "AdaptiveDSSync", "Butterfly", "DSSync", "Global", "Hierarchical", "LocalSGD", "Schedule", "Shuffle",
    "Static", "Strategy", "TopologyAware",
    "consensus_distance", "mixing_matrix", "spectral_gap",
]
