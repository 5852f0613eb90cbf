"""The import graph of distsim/ (lazy imports and type-checking imports included) has no cycle, and no package imports
one above it: the layers of README's architecture section, lowest first."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[2] / "distsim"

LAYERS = {
    "core": 0,  # values and the registries their names are checked against: strategy, cluster, models, schedules
    "sim": 1,  # costs, event flow, engine, timeline, metrics, memory
    "infra": 1,  # processes: the launcher, machine load, the self-check's arithmetic
    "plans": 2,  # plan kinds and simulate()
    "search": 3,  # the drivers
    "io": 3,  # files, traces, plots, output
    "elastic": 4,
    "profiler": 4,
    "executor": 5,
    "cli": 6,
}
"""A module may import its own package and packages of a lower number only (two packages on one level: neither)."""


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


def layer(module: str) -> str | None:
    """The layer package of a distsim module (None for the top-level package and its entry points)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_import_graph_has_no_cycle() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_every_module_lives_in_a_layer() -> None:
    loose = [m for m in import_graph() if layer(m) is None and m not in ("distsim", "distsim.__main__")]
    assert not loose, f"modules outside the layers of {sorted(LAYERS)}: {loose}"


def test_no_import_runs_up_a_layer() -> None:
    up = [f"{a} -> {b}" for a, b in import_graph().edges
          if layer(a) and layer(b) and layer(a) != layer(b) and LAYERS[layer(b)] >= LAYERS[layer(a)]]  # fmt: skip
    assert not up, f"imports of a package on the same or a higher layer: {up}"


def test_a_toy_upward_import_is_caught() -> None:
    """The check above is not vacuous: an edge from core up to cli would be reported."""
    graph = import_graph()
    graph.add_edge("distsim.core.strategy", "distsim.cli.common")
    up = [(a, b) for a, b in graph.edges if layer(a) and layer(b) and LAYERS[layer(b)] > LAYERS[layer(a)]]
    assert ("distsim.core.strategy", "distsim.cli.common") in up


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    """The check would be empty if it missed the imports inside functions and TYPE_CHECKING blocks."""
    graph = import_graph()
    assert graph.has_edge("distsim.io.files", "distsim.plans")  # lazy, inside functions
    assert graph.number_of_edges() > 100
