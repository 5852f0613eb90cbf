"""The import graph of distsim/ (lazy imports and type-checking imports included) has no cycle but the ones listed
here, which are being removed (issue 20): a module that imports one that imports it back is a layer reaching up."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "distsim"

KNOWN_CYCLES = [{"distsim.plans.plan", "distsim.plans.burst_form"}]
"""Cycles that remain until plans become a registry of kinds (issue 20); this list only ever shrinks."""


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph() -> nx.DiGraph:
    """Module -> the distsim modules it imports, anywhere in its body (a submodule's import of its own package
    is not an edge)."""
    mods, graph = _modules(), nx.DiGraph()
    for name, path in mods.items():
        graph.add_node(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph.add_edge(name, target)
    return graph


def test_the_import_graph_has_no_new_cycle() -> None:
    cycles = [c for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    """The check would be empty if it missed the imports inside functions and TYPE_CHECKING blocks."""
    graph = import_graph()
    assert graph.has_edge("distsim.plans.plan", "distsim.plans.burst_form")  # lazy, inside methods
    assert graph.number_of_edges() > 100
