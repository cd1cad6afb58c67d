"""Skip tests marked ``root`` unless we are root with iproute2 and unshare; give each a fresh tiny spec."""

from __future__ import annotations

import pytest

from dssync.lab.cluster import ClusterError, parse_cluster, require_root_and_tools


def _can_build() -> str | None:
    try:
        require_root_and_tools()
    except ClusterError as exc:
        return str(exc)
    return None


SKIP_REASON = _can_build()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if SKIP_REASON is None:
        return
    for item in items:
        if item.get_closest_marker("root"):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture
def two_racks():
    """2 racks x 2 hosts; 1000 Mbit/s host links except host 1 at 100; 50 Mbit/s uplinks."""
    return parse_cluster(
        """
        name = "test-two-racks"
        [cluster]
        racks = 2
        hosts_per_rack = 2
        host_rate_mbit = 1000
        rack_uplink_mbit = 50
        [[host_override]]
        host = 1
        rate_mbit = 100
        """,
        source="two_racks (test)",
    )
