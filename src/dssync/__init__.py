"""dssync: divide-and-shuffle synchronization for data-parallel PyTorch training.

Adopt it in place of DistributedDataParallel::

    sync = dssync.DSSync(model, schedule=dssync.Shuffle(group_size=2))
    ...
    optimizer.step()
    sync.step()          # average parameters inside this step's group

Ranks with uneven data keep serving their groups until all are done, as with DDP::

    with torch.distributed.algorithms.join.Join([sync]):
        for batch in loader: ...

Or where PyTorch's model averagers stand (e.g. in ``PostLocalSGDOptimizer``)::

    averager = dssync.GroupAverager(dssync.Shuffle(2))
    averager.average_parameters(model.parameters())

See :class:`dssync.DSSync` for a runnable example.
"""

from dssync.comm import consensus_distance
from dssync.comm.averager import GroupAverager
from dssync.schedules import (
    Bipartite,
    Butterfly,
    Global,
    Schedule,
    Shuffle,
    Static,
    TopologyAware,
    mixing_matrix,
    spectral_gap,
)
from dssync.strategies import (
    BSP,
    AsyncDSSync,
    DSSync,
    Hierarchical,
    LocalSGD,
    Strategy,
    nesterov,
)

__version__ = "0.1.0"

__all__ = [
    "BSP",
    "AsyncDSSync",
    "Bipartite",
    "Butterfly",
    "DSSync",
    "Global",
    "GroupAverager",
    "Hierarchical",
    "LocalSGD",
    "Schedule",
    "Shuffle",
    "Static",
    "Strategy",
    "TopologyAware",
    "consensus_distance",
    "mixing_matrix",
    "nesterov",
    "spectral_gap",
]
