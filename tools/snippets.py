"""The code in README.md and docs/ is the code in examples/, or a doctest that runs.

Every ```python block in the README and under docs/ is one of two kinds:

* a copy of an example file, or of one marked region of it, announced on the line before the
  fence by ``<!-- example: examples/quickstart.py -->`` (the whole file) or
  ``<!-- example: examples/train_lightning.py#strategy -->`` (the lines between
  ``# [start:strategy]`` and ``# [end:strategy]`` in that file, dedented). The region markers
  are left out of every copy. The example files themselves are run by the tests;
* a doctest (its lines start with ``>>>``), run by ``tests/docs/test_snippets.py``.

Any other python block is an error: a snippet nobody runs drifts. ``--write`` refreshes every
announced copy from its file; ``--check`` (the default) names each stale or unannounced block.

    .venv/bin/python tools/snippets.py --write
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^\s*# \[(start|end):([\w-]+)\]\s*$")
ANNOUNCE = re.compile(r"<!-- example: ([\w./-]+?)(?:#([\w-]+))? -->")
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.M | re.S,
)


@dataclass
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    start: int  # offsets of the body in the document's text
    end: int
    source: str | None  # "examples/x.py" or "examples/x.py#region", when announced


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip().rsplit("\n", 1)[-1]
        ann = ANNOUNCE.search(before)
        source = None
        if ann:
            source = ann.group(1) + (f"#{ann.group(2)}" if ann.group(2) else "")
        found.append(
            Block(
                doc=doc,
                line=text.count("\n", 0, m.start()) + 1,
                lang=m.group("lang"),
                body=m.group("body"),
                start=m.start("body"),
                end=m.end("body"),
                source=source,
            )
        )
    return found


def example_text(source: str, root: Path = ROOT) -> str:
    """The text a block announcing ``source`` must hold: the file, or one region of it."""
    path, _, region = source.partition("#")
    lines = (root / path).read_text().splitlines(keepends=True)
    if not region:
        return "".join(ln for ln in lines if not MARK.match(ln))
    inside, picked, seen = False, [], False
    for ln in lines:
        m = MARK.match(ln)
        if m and m.group(2) == region:
            inside, seen = m.group(1) == "start", True
        elif not m and inside:
            picked.append(ln)
    if not seen or not picked:
        raise LookupError(f"{path} has no region '# [start:{region}]' ... '# [end:{region}]'")
    return textwrap.dedent("".join(picked))


def is_doctest(block: Block) -> bool:
    return block.body.lstrip().startswith(">>>")


def problems(root: Path = ROOT) -> list[str]:
    """One line per block that is stale, unannounced or announces a missing file or region."""
    out = []
    for doc in documents(root):
        for b in blocks(doc):
            where = f"{doc.relative_to(root)}:{b.line}"
            if b.source is None:
                if b.lang == "python" and not is_doctest(b):
                    out.append(
                        f"{where}: a python block that is neither an example file nor a doctest;"
                        " put it in examples/ and announce it with <!-- example: examples/... -->"
                    )
                continue
            try:
                want = example_text(b.source, root)
            except (OSError, LookupError) as e:
                out.append(f"{where}: {e}")
                continue
            if b.body != want:
                out.append(f"{where}: differs from {b.source}; run tools/snippets.py --write")
    return out


def write(root: Path = ROOT) -> int:
    """Refresh every announced block from its file; return how many changed."""
    changed = 0
    for doc in documents(root):
        text = doc.read_text()
        for b in reversed(blocks(doc)):
            if b.source is not None:
                want = example_text(b.source, root)
                if b.body != want:
                    text, changed = text[: b.start] + want + text[b.end :], changed + 1
        doc.write_text(text)
    return changed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="refresh the copies from examples/")
    args = ap.parse_args()
    if args.write:
        print(f"snippets: {write()} block(s) refreshed")
    found = problems()
    for p in found:
        print(p, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
