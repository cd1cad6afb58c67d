"""The package's import graph: no cycles, and no layer reaching up into the ones built on it.

Read from the source with ``ast`` (nothing is imported). Every import counts, also one inside a
function or under ``if TYPE_CHECKING:``: hiding an import there hides the dependency, not the
cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dssync

ROOT = Path(dssync.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _target(name: str) -> str | None:
    """The dssync module that ``import name`` loads last (a package's __init__ included)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """The dssync modules ``module`` imports anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {t for a in node.names if (t := _target(a.name))}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for a in node.names:  # ``from pkg import mod`` loads pkg.mod
                t = _target(f"{base}.{a.name}") if f"{base}.{a.name}" in MODULES else _target(base)
                if t:
                    found.add(t)
    found.discard(module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    assert {"dssync.strategies", "dssync.errors"} <= GRAPH["dssync.lab.methods"]
    assert "dssync.lab.cluster.shell" in GRAPH["dssync.lab.cluster.netns"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(GRAPH) == []


# docs/design.md's layers, lowest first: each imports only from those before it. The library
# (what `import dssync` and a training script use; torch alone) comes first, then the lab, which
# nothing in the library imports.
LIBRARY = [
    "errors",
    "hashing",
    "saving",
    "schedules",
    "comm",
    "testing",
    "topology",
    "strategies",
    "checkpoint",
    "lightning",
    "accelerate",
    "elastic",
]
LAB = [
    "launch",
    "cluster",
    "workloads",
    "plan",
    "config",
    "baselines",
    "methods",
    "train",
    "elastic",
    "bench",
    "experiments",
    "report",
    "cli",
]
LAYERS = [f"dssync.{n}" for n in LIBRARY] + [f"dssync.lab.{n}" for n in LAB]


def _folder(module: str) -> str:
    """The layer ``module`` belongs to: ``dssync.comm.exchange`` -> ``dssync.comm``,
    ``dssync.lab.train.loop`` -> ``dssync.lab.train``."""
    parts = module.split(".")
    return ".".join(parts[:3] if parts[1:2] == ["lab"] else parts[:2])


def test_each_layer_imports_only_the_ones_below_it():
    rank = {name: i for i, name in enumerate(LAYERS)}
    wrong = sorted(
        f"{m} -> {t}"
        for m, ts in GRAPH.items()
        for t in ts
        if _folder(m) in rank and _folder(t) in rank and rank[_folder(t)] > rank[_folder(m)]
    )
    assert wrong == []
    unplaced = {_folder(m) for m in MODULES} - set(rank)
    unplaced -= {"dssync", "dssync.__main__", "dssync.lab"}
    assert not unplaced, "add these folders to LAYERS and to docs/design.md's layers"


def test_the_library_never_imports_the_lab():
    library = [m for m in GRAPH if not m.startswith("dssync.lab") and m != "dssync.__main__"]
    wrong = sorted(f"{m} -> {t}" for m in library for t in GRAPH[m] if t.startswith("dssync.lab"))
    assert wrong == []


def test_the_layer_test_catches_an_upward_import():
    rank = {name: i for i, name in enumerate(LAYERS)}
    assert rank[_folder("dssync.lab.train.loop")] > rank[_folder("dssync.strategies.dssync")]
    assert rank[_folder("dssync.comm.exchange")] < rank[_folder("dssync.lab.cli.output")]
