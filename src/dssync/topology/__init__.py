"""Which ranks share a host and a rack, and how fast the links between them are.

Example::

    from dssync.topology import Topology, detect

    topo = detect()                      # from the launcher's environment (and an optional probe)
    topo.ranks_in_rack(0)
"""

from dssync.topology.detect import detect, from_env
from dssync.topology.model import Topology
from dssync.topology.probe import probe_bandwidth, probe_pairs

__all__ = ["Topology", "detect", "from_env", "probe_bandwidth", "probe_pairs"]
