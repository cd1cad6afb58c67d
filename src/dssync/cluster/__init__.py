"""Emulated cluster: network namespaces, veth pairs, bridges and ``tc tbf`` rate limits.

Example::

    from dssync.cluster import Cluster, load_topology

    spec = load_topology("s2-inter-rack")
    with Cluster(spec) as cluster:
        result = cluster.run([sys.executable, "train.py"], timeout_s=600)
"""

from dssync.cluster.accounting import LinkBytes, diff, link_bytes
from dssync.cluster.launch import RunResult, Workers, launch, rank_env
from dssync.cluster.netns import Cluster, list_prefixes, remove_prefix
from dssync.cluster.probe import measure_mbit
from dssync.cluster.scenario import Scenario, Step, plan
from dssync.cluster.shell import ClusterError, require_root_and_tools
from dssync.cluster.spec import (
    ClusterSpec,
    Event,
    TopologyError,
    load_topology,
    parse_topology,
    shipped_topologies,
)

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterSpec",
    "Event",
    "LinkBytes",
    "RunResult",
    "Scenario",
    "Step",
    "TopologyError",
    "Workers",
    "diff",
    "launch",
    "link_bytes",
    "list_prefixes",
    "load_topology",
    "measure_mbit",
    "parse_topology",
    "plan",
    "rank_env",
    "remove_prefix",
    "require_root_and_tools",
    "shipped_topologies",
]
