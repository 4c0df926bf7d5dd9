"""workers/ imports in one direction: no module imports, even inside a function, one that
imports it back (``runtime`` -> ``slots`` -> ``worker``, never ``slots`` -> ``runtime``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def graph() -> dict[str, set[str]]:
    """workers module -> the workers modules it imports (``from workers import x`` included)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "workers").glob("*.py")):
        name = f"workers.{path.stem}" if path.stem != "__init__" else "workers"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("workers.")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == "workers":
                    found |= {f"workers.{a.name}" for a in node.names}
                elif node.module.startswith("workers."):
                    found.add(node.module)
        out[name] = found - {name}
    return out


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_workers_package_has_no_import_cycle() -> None:
    edges = graph()
    edges.pop("workers")  # the package's __init__ re-exports its leaves; everything imports it
    assert cycle(edges) is None, " -> ".join(cycle(edges) or [])


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
