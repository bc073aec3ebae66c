"""The package structure (docs/architecture.md, "Packages"): every import statement of the code,
at module level or inside a function, `TYPE_CHECKING` blocks included, goes down the layers or
across one, and no modules import each other in a circle. A function-level import does not open a
circle: the call it serves still runs upward."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
LAYER = {
    "model_specs": 1, "cluster_specs": 1, "cost_models": 2, "planner": 3, "runtime": 4, "api": 4, "agent": 5,
    "autopar": 6, "bench": 6,
}
"""Layer of each package: a module may import its own layer and the ones below."""


def _modules() -> dict[str, Path]:
    out = {}
    for package in LAYER:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def import_graph() -> nx.DiGraph:
    """Module -> module it imports (a name imported from a package resolves to the module that
    defines it when that is a module of its own), over every import statement."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target)
                if found is not None and found != name:
                    graph.add_edge(name, found, line=node.lineno)
    return graph


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    graph = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert circles == [], "import circles (break them by moving what both sides need into a lower module)"


def test_no_package_imports_a_higher_layer() -> None:
    graph = import_graph()
    upward = [
        (a, b, graph.edges[a, b]["line"]) for a, b in graph.edges
        if LAYER[a.split(".")[0]] < LAYER[b.split(".")[0]]
    ]
    assert upward == []


SIBLINGS_APART = {("api", "runtime"), ("runtime", "api")}
"""Packages of one layer that never import each other: the service stays free of the runtime (and torch)."""


def test_the_service_and_the_runtime_import_neither_other() -> None:
    graph = import_graph()
    across = [(a, b) for a, b in graph.edges if (a.split(".")[0], b.split(".")[0]) in SIBLINGS_APART]
    assert across == []


def test_the_graph_sees_function_level_imports() -> None:
    # `planner.search` imports `planner.partition` (and with it OR-Tools) only when it refines a plan
    graph = import_graph()
    assert graph.has_edge("planner.search", "planner.partition")
    assert graph.has_edge("cost_models.step_time", "cost_models.stage_data")
