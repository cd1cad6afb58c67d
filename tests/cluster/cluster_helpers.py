"""Helpers for cluster tests: list namespaces and root links, check a prefix left nothing."""

from __future__ import annotations

import subprocess


def netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split(" ")[0] for line in out.stdout.splitlines()]


def root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10)
    return [line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()]


def assert_gone(prefix: str) -> None:
    assert not [n for n in netns_names() if n.startswith(prefix)]
    assert not [n for n in root_links() if n.startswith(prefix)]
