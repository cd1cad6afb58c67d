"""`dssync plan` end to end, in process: tables, JSON, scaling, validation, and bad input."""

from __future__ import annotations

import json

import pytest

from dssync.lab.cli import main

BENCH = {
    "settings": {"params": 1_000_000, "steps": 12, "dynamic_steps": 30, "warmup": 3, "period": 8},
    "results": {
        "s2-inter-rack": {
            "ddp": {"iter_time_s": 0.35, "sync_time_s": 0.30, "topology": None},
            "dssync": {"iter_time_s": 0.55, "sync_time_s": 0.50, "topology": None},
            "dssync-topo": {
                "iter_time_s": 0.10,
                "sync_time_s": 0.05,
                "topology": "Topology(8 ranks, 8 hosts, 2 racks, host Mbit/s {0:950, 1:950, 2:950, "
                "3:950, 4:950, 5:950, 6:950, 7:950}, uplink 190 Mbit/s, slow hosts [])",
            },
        }
    },
}


def run(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(["plan", *args])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_table_fits_80_columns(capsys):
    code, out, _ = run(
        ["--topology", "s2-inter-rack", "--params", "4000000", "--compute-ms", "50"], capsys
    )
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines())
    for method in ("ddp", "hierarchical", "dssync", "dssync-topo", "overlapped", "steps to 1e-3"):
        assert method in out


def test_plan_json_scales_to_1024_workers(capsys, tmp_path):
    topo = tmp_path / "big.toml"
    code, out, _ = run(
        [
            "--topology",
            "s2-inter-rack",
            "--params",
            "4000000",
            "--workers",
            "1024",
            "--json",
            "--write-topology",
            str(topo),
        ],
        capsys,
    )
    assert code == 0
    plan = json.loads(out)
    assert plan["workers"] == 1024
    ms = plan["methods"]
    assert ms["dssync-topo"]["iter_s"] < ms["ddp"]["iter_s"] < ms["dssync"]["iter_s"]
    assert plan["steps_to_consensus"]["dssync"] > 1
    assert "racks = 256" in topo.read_text()


def test_validate_rejects_a_file_without_timings(capsys, tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"settings": {"params": 1000}, "results": {"tiny": {"ddp": {}}}}))
    code, _, err = run(["--validate", str(path)], capsys)
    assert code == 2 and "iter_time_s" in err and len(err.strip().splitlines()) == 1


def test_validate_prints_errors_per_method(capsys, tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(BENCH))
    code, out, _ = run(["--validate", str(path)], capsys)
    assert code == 0
    assert "worst iteration error" in out and "dssync-topo" in out and "%" in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--topology", "nowhere"], ["nowhere", "s2-inter-rack"]),
        (["--topology", "s2-inter-rack", "--workers", "10"], ["--workers 10", "use 8 or 12"]),
        (["--topology", "s2-inter-rack", "--params", "0"], ["--params"]),
        ([], ["exactly one of"]),
        (["--table", "--topology", "s1-homogeneous"], ["exactly one of"]),
        (["--validate", "/no/such.json"], ["no such file"]),
        (["--table", "--workers", "64"], ["--workers", "--topology"]),
        (["--topology", "tiny", "--rates", "probe"], ["--rates", "--validate"]),
        (["--topology", "tiny", "--host-json", "x.json"], ["--host-json", "--validate"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    code, out, err = run(args, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    for w in words:
        assert w in lines[0]
