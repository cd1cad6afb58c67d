"""The one-host model of N local ranks, on synthetic settings (no process is started)."""

from __future__ import annotations

import pytest
from rich.console import Console

from dssync.errors import UsageError
from dssync.lab.cli import main
from dssync.lab.plan.flows import LOCAL_FACTOR
from dssync.lab.plan.local import METHODS, LocalRun, local_table, model_size, predict_local

PARAMS, BUFFERS = 5_000, 100


def test_latency_alone_is_two_messages_a_pair_and_two_per_ring_member():
    got = predict_local(8, PARAMS, BUFFERS, host_s_per_byte=0.0, latency_s=1e-3)
    alpha = LOCAL_FACTOR * 1e-3
    assert got["dssync"] == pytest.approx(2 * alpha)
    assert got["bsp"] == pytest.approx(2 * 7 * alpha)


def test_bytes_alone_cost_gamma_per_byte_sent_and_received():
    gamma = 1e-8
    got = predict_local(4, PARAMS, BUFFERS, host_s_per_byte=gamma, latency_s=0.0)
    # A pair member sends and sums all it averages (parameters and buffers); a ring member of
    # DDP's gradient all-reduce sends 2(N-1)/N of the gradients.
    assert got["dssync"] == pytest.approx(gamma * 4 * (PARAMS + BUFFERS))
    assert got["bsp"] == pytest.approx(gamma * 4 * PARAMS * 2 * 3 / 4)


def test_the_ring_grows_with_the_ranks_and_the_pairs_do_not():
    small = predict_local(4, PARAMS, BUFFERS, 1e-8, compute_s=0.01)
    big = predict_local(32, PARAMS, BUFFERS, 1e-8, compute_s=0.01)
    assert big["dssync"] == pytest.approx(small["dssync"])
    assert big["bsp"] > small["bsp"] * 1.2


def test_one_rank_is_refused_with_the_fix():
    with pytest.raises(UsageError, match="at least 2 ranks"):
        predict_local(1, PARAMS, BUFFERS, 1e-8)


def test_digits_model_size_counts_batch_norm_statistics_as_buffers():
    params, buffers = model_size("digits")
    assert params == 64 * 64 + 64 + 2 * 64 + 64 * 10 + 10
    assert buffers == 2 * 64


def test_table_fits_80_columns_and_gives_the_error():
    run = LocalRun(
        32,
        "digits",
        30,
        PARAMS,
        BUFFERS,
        2e-7,
        50e-6,
        measured={
            m: {"sync_s": 0.2, "compute_s": 0.01, "iter_s": 0.21, "slowest_rank_sync_s": 0.3}
            for m in METHODS
        },
        predicted={"dssync": 0.05, "bsp": 0.3},
        load_average={"start": [16.0, 17.0, 18.0], "end": [20.0, 19.0, 18.0]},
    )
    console = Console(width=80, record=True)
    console.print(local_table(run))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "-75%" in text and "+50%" in text
    assert "16.0/17.0/18.0" in text
    assert run.as_dict()["error"] == pytest.approx({"dssync": -0.75, "bsp": 0.5})


@pytest.mark.parametrize(
    "args, says",
    [
        (["--measure-local", "2", "--topology", "tiny"], "exactly one of"),
        (["--topology", "tiny", "--steps", "5"], "--measure-local"),
    ],
)
def test_measure_local_is_one_mode_of_plan(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", *args])
    assert e.value.code != 0
    out, err = capsys.readouterr()
    assert says in out + err
