"""`pip install dssync` is the library: what a training script imports needs torch (and numpy).

Each check runs a fresh interpreter, imports what a training script uses, and looks at
``sys.modules``: none of the lab extra (the CLI's click and rich, tqdm, matplotlib, scikit-learn,
mlxtend) and nothing of `dssync.lab` may have been loaded. torch itself loads tqdm when it is
installed (``torch.hub``), so what counts is what the import adds after ``import torch``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

LAB_PACKAGES = {"click", "rich", "tqdm", "matplotlib", "sklearn", "mlxtend"}
LIBRARY = [
    "dssync",
    "dssync.schedules",
    "dssync.comm",
    "dssync.strategies",
    "dssync.topology",
    "dssync.errors",
    "dssync.saving",
]

PROBE = """
import importlib, json, sys
for before in {before!r}:
    importlib.import_module(before)
had = set(sys.modules)
for name in {modules!r}:
    importlib.import_module(name)
print(json.dumps(sorted(set(sys.modules) - had)))
"""


def added_modules(modules: list[str], before: tuple[str, ...] = ("torch", "numpy")) -> set[str]:
    code = PROBE.format(modules=modules, before=before)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def offenders(added: set[str]) -> set[str]:
    """The lab's packages among ``added``, and ``dssync.lab`` if any of it was loaded."""
    top = {m.split(".")[0] for m in added}
    lab = {"dssync.lab"} if any(m.split(".")[:2] == ["dssync", "lab"] for m in added) else set()
    return (top & LAB_PACKAGES) | lab


def test_the_library_imports_nothing_from_the_lab():
    added = added_modules(LIBRARY)
    assert "dssync.strategies" in added  # the probe saw the imports
    assert not offenders(added), f"the library loaded {sorted(offenders(added))}"
    # the elastic extra (torchft) is imported by `import dssync.elastic` only
    assert not {m for m in added if m.split(".")[0] == "torchft" or m == "dssync.elastic"}


@pytest.mark.parametrize("door", ["lightning", "accelerate"])
def test_a_door_adds_nothing_from_the_lab_beyond_its_framework(door):
    pytest.importorskip(door)
    added = added_modules([f"dssync.{door}"], before=("torch", "numpy", door))
    assert f"dssync.{door}" in added
    assert not offenders(added), f"dssync.{door} loaded {sorted(offenders(added))}"


def test_the_probe_would_see_a_lab_import():
    assert offenders(added_modules(["dssync.lab.cli"])) >= {"click", "dssync.lab"}


def test_the_command_without_the_lab_extra_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    from dssync import __main__ as entry

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "click" else real(name, *a)
    )
    with pytest.raises(SystemExit) as e:
        entry.main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "click" in err and "pip install 'dssync[lab]'" in err
