"""The package's import graph: no cycles, and no layer reaching up into the ones built on it.

Read from the source with ``ast`` (nothing is imported). Every import counts, also one inside a
function or under ``if TYPE_CHECKING:``: hiding an import there hides the dependency, not the
cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dssync

ROOT = Path(dssync.__file__).parent
# Folders that build on the library: nothing in the library may import them. The emulated
# cluster is a tool for experiments; the library's own Topology knows nothing of it.
UPPER = ("dssync.cli", "dssync.experiments", "dssync.bench", "dssync.cluster")
# Which upper folders each upper folder may use (cli runs experiments, experiments run benches
# on clusters).
# Known and being removed by the training-loop restructure; delete each line once it is gone
# (the tests below fail on a stale entry, so this list can only shrink).
KNOWN_CYCLES: list[list[str]] = []
KNOWN_UPWARD: set[str] = {
    # --sync auto runs the planner's cost model inside the training worker.
    "dssync.methods -> dssync.plan.auto",
    "dssync.train.auto -> dssync.plan.auto",
}
MAY_USE = {
    "dssync.cli": UPPER,
    "dssync.experiments": ("dssync.experiments", "dssync.bench", "dssync.cluster"),
    "dssync.bench": ("dssync.bench", "dssync.cluster"),
    "dssync.cluster": ("dssync.cluster",),
    "dssync.plan": ("dssync.bench", "dssync.cluster"),  # plans from cluster specs and link bounds
}


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
    assert {"dssync.strategies", "dssync.errors"} <= GRAPH["dssync.methods"]
    assert "dssync.cluster.shell" in GRAPH["dssync.cluster.netns"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = [c for c in cycles(GRAPH) if c not in KNOWN_CYCLES]
    assert found == []
    stale = [c for c in KNOWN_CYCLES if c not in cycles(GRAPH)]
    assert stale == [], "these cycles are gone: remove them from KNOWN_CYCLES"


@pytest.mark.parametrize("upper", UPPER)
def test_lower_layers_never_import_upper_ones(upper):
    wrong = {
        f"{m} -> {t}"
        for m, ts in GRAPH.items()
        for t in ts
        if (t == upper or t.startswith(upper + "."))
        and upper not in MAY_USE.get(_folder(m), ())
        and m != "dssync.__main__"
    }
    assert sorted(wrong - KNOWN_UPWARD) == []
    stale = sorted(
        k
        for k in KNOWN_UPWARD
        if k.endswith(f"-> {upper}") or f"-> {upper}." in k
        if k not in wrong
    )
    assert stale == [], "these imports are gone: remove them from KNOWN_UPWARD"


# The README's layout, lowest first: each imports only from those before it.
LAYERS = [
    "errors",
    "hashing",
    "saving",
    "schedules",
    "comm",
    "testing",
    "topology",
    "strategies",
    "methods",
    "lightning",
    "accelerate",
    "elastic",
    "workloads",
    "launch",
    "train",
    "cluster",
    "bench",
    "plan",
    "experiments",
    "report",
    "cli",
]
TYPE_ONLY = {"dssync.methods -> dssync.train.config"}  # TrainConfig named in annotations only


def test_each_layer_imports_only_the_ones_below_it():
    rank = {f"dssync.{name}": i for i, name in enumerate(LAYERS)}
    wrong = {
        f"{m} -> {t}"
        for m, ts in GRAPH.items()
        for t in ts
        if _folder(m) in rank and _folder(t) in rank and rank[_folder(t)] > rank[_folder(m)]
    }
    assert sorted(wrong - TYPE_ONLY - KNOWN_UPWARD) == []
    unplaced = {_folder(m) for m in MODULES} - set(rank) - {"dssync", "dssync.__main__"}
    assert not unplaced, "add these folders to LAYERS and to the README's layout section"


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:2])
