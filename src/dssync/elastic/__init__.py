"""Elastic DS-Sync: replicas that come and go while the others train, on torchft.

torchft (``pip install 'dssync[elastic]'``) provides the membership (a Lighthouse's quorum of
live replicas), reconfigurable process groups, healing of a joining replica from a live peer
(its checkpoint transport) and the two-phase commit; dssync provides the groups each averaging
(its schedules over the quorum's replicas) and the averaging inside a group. ``import dssync``
does not import this package (nor torchft); ``import dssync.elastic`` does.

Example::

    from dssync.elastic import ElasticDSSync, ReplicaManager
    manager = ReplicaManager("replica_0", "http://127.0.0.1:29510", min_replicas=2)
    sync = ElasticDSSync(model, manager, optimizer=opt)
"""

from dssync.errors import UsageError

try:
    import torchft  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the install
    raise UsageError(
        "dssync.elastic needs torchft: pip install 'dssync[elastic]' (torchft==0.2.0)"
    ) from e

from dssync.elastic.quorum import Members, QuorumGloo, ReplicaManager, replica_number
from dssync.elastic.sync import REFUSED, Averaging, ElasticDSSync

__all__ = [
    "REFUSED",
    "Averaging",
    "ElasticDSSync",
    "Members",
    "QuorumGloo",
    "ReplicaManager",
    "replica_number",
]
