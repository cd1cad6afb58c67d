"""Write docs/reference.md, the API reference, from the public API's signatures and docstrings.

The public API is everything in ``dssync.__all__`` and the doors ``dssync.lightning``,
``dssync.accelerate``, ``dssync.elastic`` and ``dssync.testing``. The page is plain markdown (readable on GitHub or in
an editor, and in the built site): for each class its signature, docstring and public methods,
for each function its signature and docstring. Docstrings are kept as written; their reST roles
(:class:`~dssync.X`) become `X`, ``literal`` becomes `literal`, a ``::`` block or an
``Args:`` section becomes a code block or a list. tests/docs/test_api_reference.py fails when the
page is not what this writes.

    python tools/api_reference.py           # write docs/reference.md
    python tools/api_reference.py --check   # exit 1 if docs/reference.md is stale
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference.md"
COMMAND = "python tools/api_reference.py"
# The doors, each with the extra that installs what it imports.
DOORS = {
    "dssync.lightning": "pip install 'dssync[lightning]'",
    "dssync.accelerate": "pip install 'dssync[accelerate]'",
    "dssync.elastic": "pip install 'dssync[elastic]'",
    "dssync.testing": None,
}
# Sections of the top-level names, by the subpackage that defines them; others get their own.
SECTIONS = {
    "strategies": "Strategies",
    "schedules": "Schedules",
    "comm": "Averaging core and devices",
    "topology": "Topology",
    "saving": "Checkpoints",
    "errors": "Errors",
}
SECTION_ARGS = re.compile(
    r"^(Args|Arguments|Parameters|Attributes|Raises|Returns|Yields|Note|Notes|Warns):\s*$"
)
LISTED = {"Args", "Arguments", "Parameters", "Attributes", "Raises"}  # "name: text" items
ROLE = re.compile(r":[\w:]+:`(~?)([^`]+)`")
LITERAL = re.compile(r"``(.+?)``")
RST_TABLE = re.compile(r"^=+( +=+)+\s*$")
STAR_IN_WORD = re.compile(r"(?<=[\w)])\*+(?=[\w(])")  # 2*n, k**d: not emphasis
MEMORY_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


class MissingDoor(RuntimeError):
    """A door's package is not installed, so its reference cannot be written."""


# ---- docstrings to markdown -------------------------------------------------------------------


def inline(text: str) -> str:
    """Roles and reST literals as markdown code spans; ``2*n`` and ``<tag`` escaped outside them."""

    def role(m: re.Match) -> str:
        target = m.group(2)
        if "<" in target and target.endswith(">"):  # :class:`text <target>`
            target = target.split("<", 1)[0].strip()
        return f"`{target.rsplit('.', 1)[-1] if m.group(1) else target}`"

    text = ROLE.sub(role, text)
    text = LITERAL.sub(lambda m: f"`{m.group(1)}`", text)
    parts = re.split(r"(`[^`]*`)", text)  # odd items are code spans, left alone
    for i in range(0, len(parts), 2):
        parts[i] = STAR_IN_WORD.sub(lambda m: "\\*" * len(m.group()), parts[i])
        parts[i] = re.sub(r"<(?=[A-Za-z/!])", "&lt;", parts[i])
    return "".join(parts)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block(lines: list[str], i: int, base: int) -> tuple[list[str], int]:
    """The lines from ``i`` indented deeper than ``base`` (blank lines inside kept), and the end."""
    j = i
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
        j += 1
    while j > i and not lines[j - 1].strip():
        j -= 1
    return lines[i:j], j


def _dedent(lines: list[str]) -> list[str]:
    cut = min((_indent(ln) for ln in lines if ln.strip()), default=0)
    return [ln[cut:] for ln in lines]


def _fence(lines: list[str]) -> list[str]:
    return ["```", *_dedent(lines), "```"]


def _items(lines: list[str]) -> list[str]:
    """An ``Args:`` section's ``name: text`` items (continuations joined) as a list."""
    lines = _dedent(lines)
    out: list[str] = []
    for ln in lines:
        if not ln.strip():
            continue
        m = re.match(r"^(\S[^:]*?):\s+(.*)$", ln) if _indent(ln) == 0 else None
        if m:
            out.append(f"- `{m.group(1)}`: {inline(m.group(2))}")
        elif out:
            out[-1] += " " + inline(ln.strip())
        else:
            out.append(f"- {inline(ln.strip())}")
    return out


def markdown(doc: str) -> str:
    """A docstring as markdown: prose kept, roles as code spans, literal blocks fenced."""
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        ln = lines[i]
        stripped = ln.strip()
        section = SECTION_ARGS.match(stripped)
        if section and _indent(ln) == 0:
            body, i = _block(lines, i + 1, 0)
            out += ["", f"**{section.group(1)}:**", ""]
            if section.group(1) in LISTED:
                out += _items(body)
            else:
                out.append(inline(" ".join(b.strip() for b in body if b.strip())))
            out.append("")
            continue
        if RST_TABLE.match(stripped):  # a simple reST table: kept as text
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            out += ["", *_fence(lines[i:j]), ""]
            i = j
            continue
        if stripped.endswith("::"):
            intro = stripped[:-2].rstrip()
            if intro:
                out.append(" " * _indent(ln) + inline(intro) + ":")
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            body, i = _block(lines, j, _indent(ln))
            out += ["", *_fence(body), ""]
            continue
        if stripped.startswith(">>>"):  # a doctest outside a literal block
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            out += ["", *_fence(lines[i:j]), ""]
            i = j
            continue
        out.append(" " * _indent(ln) + inline(stripped) if stripped else "")
        i += 1
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# ---- signatures -------------------------------------------------------------------------------


class _Raw(str):
    """An annotation written as a string (``from __future__ import annotations``), shown bare."""

    def __repr__(self) -> str:
        return str(self)


def signature(name: str, obj: object, *, is_class: bool = False) -> str | None:
    """``name(params) -> ret``, one parameter a line when long; None where Python has none."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = []
    for p in sig.parameters.values():
        if isinstance(p.annotation, str):
            p = p.replace(annotation=_Raw(p.annotation))
        params.append(p)
    ret = sig.return_annotation
    if is_class or ret is inspect.Signature.empty:
        ret = inspect.Signature.empty
    elif isinstance(ret, str):
        ret = _Raw(ret)
    sig = sig.replace(parameters=params, return_annotation=ret)
    text = f"{name}{sig}"
    if MEMORY_ADDRESS.search(text):
        raise ValueError(f"{name}: a default prints its memory address ({text}); give it a repr")
    if len(text) <= 88:
        return text
    shown = str(sig.replace(return_annotation=inspect.Signature.empty))[1:-1]
    args = _split_params(shown)
    tail = "" if ret is inspect.Signature.empty else f" -> {inspect.formatannotation(ret)}"
    return f"{name}(\n" + "".join(f"    {a},\n" for a in args) + f"){tail}"


def _split_params(text: str) -> list[str]:
    """Split ``a: int = 1, b: dict[str, int] = {}`` at the top-level commas."""
    out, depth, start = [], 0, 0
    quote = None
    for k, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:k].strip())
            start = k + 1
    out.append(text[start:].strip())
    return [a for a in out if a]


# ---- the page ---------------------------------------------------------------------------------


def _doc(obj: object) -> str:
    doc = inspect.getdoc(obj)
    return markdown(doc) if doc else "(no docstring)"


def _members(cls: type) -> list[tuple[str, object]]:
    """The public methods and properties ``cls`` and its dssync bases define, in source order."""
    seen: dict[str, object] = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("dssync"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if inspect.isfunction(value) or isinstance(value, property):
                seen[name] = value
    return list(seen.items())


def _class(lines: list[str], qualname: str, cls: type) -> None:
    short = cls.__name__
    lines += [f"### `{qualname}`", ""]
    sig = signature(short, cls, is_class=True)
    if sig and not issubclass(cls, BaseException):
        lines += ["```", f"class {sig}", "```", ""]
    elif issubclass(cls, BaseException):
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        lines += ["```", f"class {short}({bases})", "```", ""]
    lines += [_doc(cls), ""]
    for name, member in _members(cls):
        lines += [f"#### `{short}.{name}`", ""]
        if isinstance(member, property):
            lines += ["```", f"{short}.{name}  (property)", "```", ""]
            lines += [_doc(member.fget) if member.fget else "(no docstring)", ""]
            continue
        sig = signature(name, member)
        params = inspect.signature(member).parameters
        if sig and params and next(iter(params)) in ("self", "cls"):
            sig = re.sub(r"^(\w+)\(\s*(?:self|cls),?\s*", r"\1(", sig)
            sig = sig.replace("(\n)", "()")
        if sig:
            lines += ["```", f"{short}.{sig}", "```", ""]
        lines += [_doc(member), ""]


def _entry(lines: list[str], qualname: str, obj: object) -> None:
    name = qualname.rsplit(".", 1)[-1]
    if inspect.isclass(obj):
        _class(lines, qualname, obj)
    elif inspect.ismodule(obj):
        lines += [f"### `{qualname}`", "", "(a module)", "", _doc(obj), ""]
    elif callable(obj):
        lines += [f"### `{qualname}`", ""]
        sig = signature(name, obj)
        if sig:
            lines += ["```", sig, "```", ""]
        lines += [_doc(obj), ""]
    else:  # a constant: its value (its type's docstring is not its own)
        lines += [f"### `{qualname}`", "", "```", f"{name} = {obj!r}", "```", ""]


def public(module: ModuleType) -> list[str]:
    """``module.__all__``, or the public names it defines itself."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        ]
    return sorted(names, key=lambda n: (n.lower(), n))


def door(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise MissingDoor(
            f"{name} cannot be imported ({e}); its reference needs it: {DOORS[name]}, "
            f"then run `{COMMAND}`"
        ) from e


def render() -> str:
    """The reference page, as markdown."""
    import dssync

    lines = [
        "# API reference",
        "",
        f"<!-- Written by `{COMMAND}` from the docstrings; edit those, not this page. -->",
        "",
        "Generated from the signatures and docstrings of the public API: every name in",
        "`dssync.__all__`, then `dssync.lightning`, `dssync.accelerate`, `dssync.elastic` and",
        "`dssync.testing`. Regenerate it with `" + COMMAND + "`.",
        "",
    ]
    groups: dict[str, list[str]] = {}
    for n in public(dssync):
        where = getattr(getattr(dssync, n), "__module__", "dssync").split(".")
        groups.setdefault(where[1] if len(where) > 1 else "dssync", []).append(n)
    order = [k for k in SECTIONS if k in groups] + sorted(k for k in groups if k not in SECTIONS)
    doors = {name: door(name) for name in DOORS}

    contents = []
    for key in order:
        title = _section(key)
        links = ", ".join(f"[`{n}`](#{_anchor('dssync.' + n)})" for n in groups[key])
        contents.append(f"- {title}: {links}")
    for name, module in doors.items():
        links = ", ".join(f"[`{n}`](#{_anchor(name + '.' + n)})" for n in public(module))
        contents.append(f"- [`{name}`](#{_anchor(name)}): {links}")
    lines += ["## Contents", "", *contents, "", "## `dssync`", "", _doc(dssync), ""]

    for key in order:
        lines += [f"## {_section(key)}", ""]
        for n in groups[key]:
            _entry(lines, f"dssync.{n}", getattr(dssync, n))
    for name, module in doors.items():
        lines += [f"## `{name}`", "", _doc(module), ""]
        for n in public(module):
            _entry(lines, f"{name}.{n}", getattr(module, n))
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


def _section(key: str) -> str:
    return SECTIONS.get(key, "From `dssync`" if key == "dssync" else f"From `dssync.{key}`")


def _anchor(heading: str) -> str:
    """The id MkDocs and GitHub both give a heading of `heading` (dots and backticks dropped)."""
    return re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = ap.parse_args()
    try:
        text = render()
    except MissingDoor as e:
        print(f"api_reference: {e}", file=sys.stderr)
        return 2
    if args.check:
        if PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"api_reference: wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
