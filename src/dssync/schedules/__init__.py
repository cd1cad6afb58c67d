"""Partition schedules: pure functions of (step, world size) that say which ranks average together."""

from dssync.schedules.base import Partition, Schedule, check_partition, group_of, split_even
from dssync.schedules.basic import (
    Butterfly,
    Global,
    Shuffle,
    Static,
    default_schedule,
    peer_bound,
)
from dssync.schedules.fragments import Fragments
from dssync.schedules.mixing import consensus_error, mixing_matrix, product_matrix, spectral_gap

__all__ = [
    "Butterfly",
    "Fragments",
    "Global",
    "Partition",
    "Schedule",
    "Shuffle",
    "Static",
    "check_partition",
    "consensus_error",
    "default_schedule",
    "group_of",
    "mixing_matrix",
    "peer_bound",
    "product_matrix",
    "spectral_gap",
    "split_even",
]

from dssync.schedules.names import SCHEDULE_NAMES, schedule_from_name  # noqa: E402

__all__ += ["SCHEDULE_NAMES", "schedule_from_name"]
from dssync.schedules.topology import TopologyAware, plan_topology_aware  # noqa: E402

__all__ += ["TopologyAware", "plan_topology_aware"]
from dssync.schedules.gossip import Bipartite, ExpGossip, ring_matrix, ring_peers  # noqa: E402

__all__ += ["Bipartite", "ExpGossip", "ring_matrix", "ring_peers"]
