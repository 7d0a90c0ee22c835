"""The collectors' imports: no circles among the collector modules, and the base class knows
no collector (type-only imports aside)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "exporter" / "collectors"
PREFIX = "exporter.collectors"


def module_name(path: Path) -> str:
    return PREFIX if path.stem == "__init__" else f"{PREFIX}.{path.stem}"


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The collector modules ``path`` imports, lazily or not, outside ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return (found & known) - {module_name(path)}


def graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.glob("*.py"))
    known = {module_name(path) for path in paths}
    return {module_name(path): imports_of(path, known) for path in paths}


def test_no_import_circles_among_the_collectors() -> None:
    edges = graph()
    for start in edges:
        seen: set[str] = set()
        todo = list(edges[start])
        while todo:
            module = todo.pop()
            assert module != start, f"{start} imports itself through {sorted(seen)}"
            if module not in seen:
                seen.add(module)
                todo += edges[module]


def test_the_base_class_and_the_shared_state_know_no_collector() -> None:
    edges = graph()
    assert edges[f"{PREFIX}.base"] == set()
    assert edges[f"{PREFIX}.shared_state"] == set()
