"""Emulated cluster: network namespaces, veth pairs, bridges and ``tc tbf`` rate limits.

Modules, lowest first: ``shell`` (iproute2 calls), ``spec`` (cluster spec files), ``names``
(namespaces, interfaces, addresses), ``shaping`` (tbf), ``torchrun`` (the command each host
runs), ``workers`` (one torchrun agent per host, waited for and stopped together), ``accounting`` (link byte counters), ``throughput`` (TCP rate between two
hosts), ``netns`` (the :class:`Cluster` that builds and tears down), ``scenario`` (timed rate
changes).

Example::

    from dssync.lab.cluster import Cluster, load_cluster

    spec = load_cluster("s2-inter-rack")
    with Cluster(spec) as cluster:
        result = cluster.run([sys.executable, "train.py"], timeout_s=600)
"""

from dssync.lab.cluster.accounting import LinkBytes, LossCounters, Losses, diff, link_bytes, losses
from dssync.lab.cluster.names import ClusterNames
from dssync.lab.cluster.netns import Cluster, list_prefixes, remove_prefix
from dssync.lab.cluster.scenario import Scenario, Step, plan
from dssync.lab.cluster.shell import ClusterError, require_root_and_tools
from dssync.lab.cluster.spec import (
    ClusterSpec,
    ClusterSpecError,
    Event,
    load_cluster,
    parse_cluster,
    shipped_clusters,
)
from dssync.lab.cluster.throughput import measure_mbit
from dssync.lab.cluster.torchrun import torchrun_argv
from dssync.lab.cluster.workers import Agents, RunResult, start_agents

__all__ = [
    "Agents",
    "Cluster",
    "ClusterError",
    "ClusterNames",
    "ClusterSpec",
    "ClusterSpecError",
    "Event",
    "LinkBytes",
    "LossCounters",
    "Losses",
    "RunResult",
    "Scenario",
    "Step",
    "diff",
    "link_bytes",
    "list_prefixes",
    "losses",
    "load_cluster",
    "measure_mbit",
    "parse_cluster",
    "plan",
    "remove_prefix",
    "require_root_and_tools",
    "shipped_clusters",
    "start_agents",
    "torchrun_argv",
]
