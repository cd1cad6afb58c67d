"""The ``dssync cluster`` click group, invoked directly with CliRunner."""

from __future__ import annotations

import re
import sys

import pytest
from click.testing import CliRunner
from cluster_helpers import assert_gone, netns_names

from dssync.lab.cli.cluster_cmd import cluster


def invoke(*args: str):
    return CliRunner().invoke(cluster, list(args))


@pytest.mark.parametrize(
    "args",
    [
        ["up", "no-such-topology"],
        ["up", "tiny", "--prefix", "Bad-Prefix"],
        ["down"],
        ["down", "dss01", "--all"],
        ["down", "not_ours"],
        ["run", "s4-dynamic", "--", "true"],
        ["run", "tiny"],
    ],
)
def test_bad_input_exits_2_with_one_line(args):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("Error")]) == 1


@pytest.mark.root
@pytest.mark.timeout(60)
def test_up_then_down():
    result = invoke("up", "tiny", "--prefix", "dsst1")
    try:
        assert result.exit_code == 0, result.output
        assert {"dsst1-h0", "dsst1-h1", "dsst1-sw"} <= set(netns_names())
        assert "dsst1" in invoke("list").output
        assert invoke("up", "tiny", "--prefix", "dsst1").exit_code == 1  # already there
    finally:
        down = invoke("down", "dsst1")
    assert down.exit_code == 0 and "3 namespaces" in down.output
    assert_gone("dsst1")
    assert invoke("down", "dsst1").exit_code == 0


@pytest.mark.root
@pytest.mark.timeout(60)
def test_down_all_removes_leftovers(monkeypatch):
    from dssync.lab.cli import cluster_cmd

    # Only touch our own leftover: other clusters may be in use on this machine.
    real = cluster_cmd.list_prefixes
    monkeypatch.setattr(cluster_cmd, "list_prefixes", lambda: [p for p in real() if p == "dsst2"])
    assert invoke("up", "tiny", "--prefix", "dsst2").exit_code == 0
    result = invoke("down", "--all")
    assert result.exit_code == 0 and "dsst2" in result.output
    assert_gone("dsst2")


@pytest.mark.root
@pytest.mark.timeout(180)
def test_run_returns_first_failing_exit_code():
    ok = invoke("run", "tiny", "--", sys.executable, "-c", "import os; print(os.environ['RANK'])")
    assert ok.exit_code == 0, ok.output
    failing = invoke(
        "run",
        "tiny",
        "--prefix",
        "dsst3",
        "--",
        sys.executable,
        "-c",
        "import os, sys, time; os.environ['RANK'] == '0' and sys.exit(5); time.sleep(30)",
    )
    assert failing.exit_code == 5  # the worker's code, read from torchrun's failure report
    assert re.search(r"host [01] \(dsst3-h[01]\): torchrun exited with code 1", failing.output)
    assert "(rank 0 exited with code 5)" in failing.output
    assert_gone("dsst3")
