"""The on-disk cache of parsed data sets: parsed once, read back equal, never in the way."""

from __future__ import annotations

import numpy as np

from dssync.lab.workloads.cache import cached_arrays, source_key


def _counted():
    calls = []

    def build():
        calls.append(1)
        return np.arange(6, dtype=np.float64).reshape(2, 3), np.array([3, 1], dtype=np.int64)

    return build, calls


def test_parsed_once_then_read_back_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("DSSYNC_CACHE_DIR", str(tmp_path))
    build, calls = _counted()
    first = cached_arrays("set-1.0", build)
    again = cached_arrays("set-1.0", build)
    assert len(calls) == 1  # the second call read the file
    for a, b in zip(first, again, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert [p.name for p in tmp_path.iterdir()] == ["set-1.0.npz"]  # no temporary left
    cached_arrays("set-2.0", build)  # another version of the source: parsed again
    assert len(calls) == 2


def test_a_broken_file_is_parsed_again_and_an_unwritable_folder_only_costs_the_parse(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DSSYNC_CACHE_DIR", str(tmp_path))
    build, calls = _counted()
    cached_arrays("set", build)
    whole = (tmp_path / "set.npz").read_bytes()
    for broken in (b"half a file", whole[: len(whole) // 2]):  # not a zip; a zip cut short
        (tmp_path / "set.npz").write_bytes(broken)
        x, _ = cached_arrays("set", build)
        assert x.shape == (2, 3)
    assert len(calls) == 3
    assert cached_arrays("set", build)[0].shape == (2, 3) and len(calls) == 3  # rewritten
    assert (tmp_path / "set.npz").stat().st_mode & 0o777 == 0o644  # readable by others
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DSSYNC_CACHE_DIR", str(blocker / "cache"))
    x, y = cached_arrays("set", build)
    assert len(calls) == 4 and y.tolist() == [3, 1]


def test_the_key_follows_the_source_file(tmp_path):
    source = tmp_path / "data.csv"
    source.write_text("1,2,3\n")
    before = source_key("set", source)
    source.write_text("1,2,3\n4,5,6\n")  # edited in place: another size
    assert source_key("set", source) != before
