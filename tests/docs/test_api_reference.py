"""docs/reference.md is what tools/api_reference.py writes from the public API's docstrings."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("api_reference", ROOT / "tools" / "api_reference.py")
api_reference = sys.modules["api_reference"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(api_reference)
try:  # the doors import lightning and accelerate: at collection, as their own tests do
    MISSING = None
    for _door in api_reference.DOORS:
        api_reference.door(_door)
except api_reference.MissingDoor as e:
    MISSING = str(e)


@pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
def test_the_reference_is_current():
    want = api_reference.render()
    have = api_reference.PAGE.read_text()
    assert have == want, "docs/reference.md is stale: run `python tools/api_reference.py`"


def test_every_public_name_has_an_entry():
    import dssync

    text = api_reference.PAGE.read_text()
    for name in dssync.__all__:
        assert f"### `dssync.{name}`" in text, name
    assert ":::" not in text  # no mkdocstrings directive, which reads as nothing outside a site


def test_roles_and_literals_become_code_spans():
    md = api_reference.markdown
    assert md("See :class:`~dssync.schedules.Fragments`.") == "See `Fragments`."
    assert md(":func:`dssync.detect` and ``wire='int8'``") == "`dssync.detect` and `wire='int8'`"
    assert md("a 2*ceil(log2 N) cycle, **bold**") == r"a 2\*ceil(log2 N) cycle, **bold**"


def test_args_become_a_list_and_literal_blocks_a_fence():
    doc = """One line.

    Args:
        every: average every ``every`` steps;
            1 is the paper's.
        **kwargs: passed on.

    Example::

        sync = DSSync(model)
        sync.step()
    """
    assert api_reference.markdown(doc) == (
        "One line.\n\n**Args:**\n\n"
        "- `every`: average every `every` steps; 1 is the paper's.\n"
        "- `**kwargs`: passed on.\n\n"
        "Example:\n\n```\nsync = DSSync(model)\nsync.step()\n```"
    )


def test_a_long_signature_takes_a_line_per_parameter():
    def f(a: int, b: dict[str, int] | None = None, *, c: str = "x, y", d: float = 1.0) -> None:
        pass

    assert api_reference.signature("f", f) == (
        "f(a: int, b: dict[str, int] | None = None, *, c: str = 'x, y', d: float = 1.0) -> None"
    )
    long = api_reference.signature("a_function_with_a_long_name_that_needs_splitting", f)
    assert long.splitlines()[1:4] == [
        "    a: int,",
        "    b: dict[str, int] | None = None,",
        "    *,",
    ]
    assert long.endswith(") -> None")


def test_a_constant_shows_its_value_not_its_types_docstring():
    lines: list[str] = []
    api_reference._entry(lines, "dssync.DEFAULT_TIMEOUT_S", 120.0)
    assert "DEFAULT_TIMEOUT_S = 120.0" in lines and "float" not in "".join(lines)
