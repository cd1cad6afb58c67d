"""The code in README.md and docs/: copies of examples/ files (which other tests run) or doctests
(run here). See tools/snippets.py."""

from __future__ import annotations

import doctest
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("snippets", ROOT / "tools" / "snippets.py")
snippets = sys.modules["snippets"] = importlib.util.module_from_spec(_spec)  # for its dataclass
_spec.loader.exec_module(snippets)


def test_every_python_block_is_a_current_example_copy_or_a_doctest():
    assert snippets.problems() == []


def test_the_readme_shows_the_examples():
    shown = {b.source for b in snippets.blocks(ROOT / "README.md") if b.source}
    assert "examples/quickstart.py" in shown
    assert all((ROOT / s.partition("#")[0]).is_file() for s in shown)


# docs/reference.md copies the docstrings (tools/api_reference.py): their doctests run from the source.
WRITTEN = ROOT / "docs" / "reference.md"


@pytest.mark.parametrize(
    "doc",
    [d for d in snippets.documents() if d != WRITTEN],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_doctests_in_the_documents_run(doc):
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    globs: dict = {}  # shared within a document: a later block may use an earlier one's names
    for b in snippets.blocks(doc):
        if b.source is None and snippets.is_doctest(b):
            test = parser.get_doctest(b.body, globs, doc.name, str(doc), b.line)
            runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def _tree(tmp_path: Path, readme: str) -> Path:
    (tmp_path / "examples").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "examples" / "a.py").write_text(
        "import x\n# [start:core]\nif x:\n    y = 1\n# [end:core]\nprint(y)\n"
    )
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_a_stale_copy_and_a_stray_block_are_named_and_write_refreshes(tmp_path):
    readme = (
        "<!-- example: examples/a.py -->\n```python\nimport x\n```\n\n"
        "<!-- example: examples/a.py#core -->\n```python\nif x:\n    y = 2\n```\n\n"
        "```python\nprint('nobody runs me')\n```\n\n```python\n>>> 1 + 1\n2\n```\n"
    )
    root = _tree(tmp_path, readme)
    found = snippets.problems(root)
    assert [p.split(":")[1] for p in found] == ["2", "7", "12"], found
    assert "differs from examples/a.py#core" in found[1] and "neither" in found[2]
    assert snippets.write(root) == 2
    text = (root / "README.md").read_text()
    assert "```python\nimport x\nif x:\n    y = 1\nprint(y)\n```" in text  # markers left out
    assert "```python\nif x:\n    y = 1\n```" in text  # the region, dedented
    assert len(snippets.problems(root)) == 1  # the stray block stays an error


def test_a_missing_region_is_named(tmp_path):
    root = _tree(tmp_path, "<!-- example: examples/a.py#nope -->\n```python\nx\n```\n")
    assert "no region '# [start:nope]'" in snippets.problems(root)[0]
