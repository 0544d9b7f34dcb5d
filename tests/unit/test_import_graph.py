"""recd's import graph: no circles (lazy imports inside functions and TYPE_CHECKING imports
count too), and the stages import each other only downstream of the table."""

from __future__ import annotations

import ast
from pathlib import Path

import recd

ROOT = Path(recd.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_lazy_imports() -> None:
    graph = _graph()
    assert "recd.table.snapshot" in graph["recd.reader.plan"]


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def _imports_package(graph: dict[str, set[str]], importer: str, imported: str) -> list[str]:
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name == importer or name.startswith(importer + ".")
        for target in targets
        if target == imported or target.startswith(imported + ".")
    )


def test_readers_and_the_table_do_not_import_the_etl() -> None:
    graph = _graph()
    for package in ("recd.reader", "recd.table", "recd.tensors"):
        assert _imports_package(graph, package, "recd.etl") == [], package


def test_the_table_and_tensors_do_not_import_training() -> None:
    graph = _graph()
    for package in ("recd.table", "recd.tensors", "recd.reader"):
        for later in ("recd.train", "recd.recovery", "recd.checkpoint"):
            assert _imports_package(graph, package, later) == [], (package, later)
