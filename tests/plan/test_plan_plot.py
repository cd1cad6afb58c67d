"""`dssync plan --table --plot`: the PNG of the table's predictions, and --plot without --table."""

from __future__ import annotations

import dataclasses
import math

from click.testing import CliRunner

from dssync.lab.cli import cli, plan_cmd
from dssync.lab.plan.clusters import cluster_for
from dssync.lab.plan.tables import make_plan
from dssync.lab.report.plan_plot import plan_plot

PNG = b"\x89PNG\r\n\x1a\n"


def test_table_plot_writes_a_png(tmp_path, monkeypatch):
    # The full table (6 topologies to 1,024 workers) takes minutes on 2 cores, and --table has
    # no option to narrow it: two cheap topologies at two scales exercise the same path.
    monkeypatch.setattr(plan_cmd, "TABLE_TOPOLOGIES", ("s1-homogeneous", "s3-slow-host"))
    monkeypatch.setattr(plan_cmd, "SCALES", (64, 256))
    path = tmp_path / "p.png"
    r = CliRunner().invoke(
        cli,
        ["plan", "--table", "--params", "1000000", "--compute-ms", "50", "--plot", str(path)],
    )
    assert r.exit_code == 0, (r.output, r.exception)
    data = path.read_bytes()
    assert data.startswith(PNG)
    assert len(data) > 5_000
    assert f"plot written to {path}" in r.output
    assert "s3-slow-host" in r.output and "256" in r.output  # the tables still print


def test_plot_leaves_out_steps_that_never_converge(tmp_path):
    plan = make_plan(cluster_for("s1-homogeneous", 64), 1_000_000, 0.05)
    never = dataclasses.replace(plan, steps={**plan.steps, "dssync-topo": math.inf})
    path = tmp_path / "never.png"
    plan_plot({"s1-homogeneous": [plan, never]}, path)
    assert path.read_bytes().startswith(PNG)


def test_plot_needs_table(tmp_path):
    for extra in ([], ["--topology", "s2-inter-rack"]):
        r = CliRunner().invoke(cli, ["plan", *extra, "--plot", str(tmp_path / "p.png")])
        assert r.exit_code == 2, (r.output, r.exception)
        assert "--plot needs --table" in r.output
    assert not (tmp_path / "p.png").exists()
