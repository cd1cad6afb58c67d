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

See :class:`dssync.DSSync` for a runnable example. Everything a training script needs is
importable from here and needs only torch (the ``dssync`` command and the lab come with
``pip install 'dssync[lab]'``).
"""

from dssync import checkpoint
from dssync.comm import consensus_distance
from dssync.comm.averager import GroupAverager
from dssync.comm.devices import local_device
from dssync.errors import DSSyncError, PeerLost, SyncError, UsageError
from dssync.saving import load, save
from dssync.schedules import (
    Butterfly,
    Global,
    Schedule,
    Shuffle,
    Static,
    TopologyAware,
    mixing_matrix,
    plan_topology_aware,
    spectral_gap,
)
from dssync.strategies import AsyncDSSync, DSSync, Options, nesterov
from dssync.topology import detect

__version__ = "0.1.0"

__all__ = [
    "AsyncDSSync",
    "Butterfly",
    "DSSync",
    "DSSyncError",
    "Global",
    "GroupAverager",
    "Options",
    "PeerLost",
    "Schedule",
    "Shuffle",
    "Static",
    "SyncError",
    "TopologyAware",
    "UsageError",
    "checkpoint",
    "consensus_distance",
    "detect",
    "load",
    "local_device",
    "mixing_matrix",
    "nesterov",
    "plan_topology_aware",
    "save",
    "spectral_gap",
]
