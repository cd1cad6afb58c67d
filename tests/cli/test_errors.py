"""A failure is classified by its class hierarchy, the same raised here or in a worker: bad input
exits 2 with one line, a run out of step exits 1 with one line, anything else is a bug (traceback)."""

from __future__ import annotations

import pytest

from dssync.errors import PeerLost, SyncError, UsageError
from dssync.lab.cli.errors import kind, report
from dssync.lab.launch import WorkerError, spawn
from dssync.lab.train.checkpoint import CheckpointDamaged


class OddInput(UsageError):
    """A subclass the CLI has never heard of by name."""


ERRORS = {
    "usage": UsageError("--x 3 is bad; use 2"),
    "usage subclass": OddInput("--y is odd; use --z"),
    "damaged checkpoint": CheckpointDamaged("checkpoint c is damaged; delete it"),
    "sync": SyncError("ranks disagree at step 4", step=4, group=[0, 1], ranks=[1]),
    "peer lost": PeerLost(
        "rank 0 lost contact with rank 1 at step 4", step=4, group=[0, 1], ranks=[1]
    ),
    "bare ValueError": ValueError("a library bug, not the user's input"),
    "KeyError": KeyError("bug"),
}
EXPECTED = {
    "usage": "usage",
    "usage subclass": "usage",
    "damaged checkpoint": "usage",
    "sync": "sync",
    "peer lost": "sync",
    "bare ValueError": "bug",
    "KeyError": "bug",
}


def _raise(name: str) -> None:
    raise ERRORS[name]


def test_every_kind_is_classified_the_same_locally_and_in_a_worker():
    for name, e in ERRORS.items():
        with pytest.raises(WorkerError) as info:
            spawn(_raise, 1, args=(name,), timeout_s=60)
        assert kind(e) == kind(info.value) == EXPECTED[name], name


def test_exit_codes_and_what_is_printed(capsys):
    assert report(UsageError("--x is bad; use 2\nmore")) == 2
    assert capsys.readouterr().err == "error: --x is bad; use 2\n"
    assert report(PeerLost("rank 0 lost contact with rank 1 at step 4")) == 1
    assert capsys.readouterr().err == "error: rank 0 lost contact with rank 1 at step 4\n"
    try:
        raise ValueError("a bug")
    except ValueError as e:
        assert report(e) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: a bug" in err
    died = WorkerError(1, "process exited with code 3", (), "died (exit code 3)")
    assert report(died) == 1
    assert capsys.readouterr().err == "error: worker rank 1 failed: died (exit code 3)\n"


def test_library_arguments_read_as_the_flags_that_set_them():
    from dssync.lab.cli.errors import as_flags

    assert as_flags("every=0 must be >= 1; try 1 or 4") == "--every=0 must be >= 1; try 1 or 4"
    assert as_flags("pass the same wire= on every rank") == "pass the same --wire on every rank"
    assert as_flags("or raise timeout_s") == "or raise --timeout"
    assert as_flags("(outer=, overlap=, replan=)") == "(--outer, --overlap, --replan)"
    assert as_flags("every rank, the schedule") == "every rank, the schedule"  # plain words
