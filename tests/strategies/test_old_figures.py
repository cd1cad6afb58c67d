"""Each old DS-Sync class's results, reproduced bit for bit by the one DSSync's options.

The figures were saved from ``DSSync``, ``AdaptiveDSSync``, ``OverlapDSSync`` and
``TopoOverlapDSSync`` before they became options (``old_figures.py`` says how).
"""

from __future__ import annotations

import json

import pytest
from old_figures import CASES, FIXTURE, run

from dssync.lab.launch import spawn

SAVED = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", sorted(CASES))
def test_options_reproduce_the_old_class(case):
    out = spawn(run, CASES[case], args=(case,), timeout_s=180)
    assert out == SAVED[case]
