"""The `lm` workload's data: whole files to training or validation, the same on every call.

Quick (no model); the training tests are in tests/workloads/test_lm.py (slow tier).
"""

from __future__ import annotations

from dssync.lab.workloads.lm import HOLD_OUT, split_files, stdlib_files, windows


def test_split_is_by_file_and_deterministic():
    files = stdlib_files()
    train, val = split_files(files)
    assert split_files(stdlib_files()) == (train, val)  # deterministic: sorted, no randomness
    assert set(train).isdisjoint(val) and sorted(train + val) == sorted(files)
    assert len(val) == len(files) // HOLD_OUT and val == files[HOLD_OUT - 1 :: HOLD_OUT]
    # no validation window comes from a training file: windows are cut file by file
    one = windows(val[:1], 16)
    raw = val[0].read_bytes()
    assert bytes(one.tensors[0][0].tolist()) == raw[:16]
    assert bytes(one.tensors[1][0].tolist()) == raw[1:17]
    assert len(one) == (len(raw) - 1) // 16
