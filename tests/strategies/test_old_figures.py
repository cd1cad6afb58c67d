"""Each old DS-Sync class's results, reproduced bit for bit by the one DSSync's options.

The figures were saved from ``DSSync``, ``AdaptiveDSSync``, ``OverlapDSSync`` and
``TopoOverlapDSSync`` before they became options (``old_figures.py`` says how).
"""

from __future__ import annotations

import json

import pytest
from old_figures import CASES, FIXTURE, cpu_kind, run

from dssync.lab.launch import spawn

SAVED = json.loads(FIXTURE.read_text())  # per kind of CPU: the bits depend on it


@pytest.mark.parametrize("case", sorted(CASES))
def test_options_reproduce_the_old_class(case):
    kind = cpu_kind()
    if kind not in SAVED:
        pytest.skip(
            f"no figures for this CPU ({kind}; the fixture has {sorted(SAVED)}): write them "
            "with the code of a commit whose figures are known right, by "
            "tests/strategies/old_figures.py"
        )
    out = spawn(run, CASES[case], args=(case,), timeout_s=180)
    assert out == SAVED[kind][case]
