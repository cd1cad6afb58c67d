"""Helpers for cluster tests: list namespaces, root links and processes; check a prefix left nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

# 2 racks x 2 hosts x 1 worker at 1000 Mbit/s: the chaos cases' cluster, one process per host.
FOUR_HOSTS = """
[cluster]
racks = 2
hosts_per_rack = 2
workers_per_host = 1
host_rate_mbit = 1000
rack_uplink_mbit = 1000
"""


def netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split(" ")[0] for line in out.stdout.splitlines()]


def root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10)
    return [line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()]


def netns_pids(ns: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    return out.stdout.split()


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (e.g. a cluster prefix)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args and "pytest" not in args:
            found.append(args)
    return found


def assert_gone(prefix: str) -> None:
    assert not [n for n in netns_names() if n.startswith(prefix)]
    assert not [n for n in root_links() if n.startswith(prefix)]
    assert not list(Path("/etc/netns").glob(f"{prefix}-*"))
    assert not processes_mentioning(f"{prefix}-h")
