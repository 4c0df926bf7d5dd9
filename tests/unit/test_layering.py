"""What the import contracts (pyproject.toml, tests/unit/test_import_contracts.py) cannot say:
only the CLI prints. Everything else returns values and lets the CLI print them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", sorted((ROOT / "supervisor").rglob("*.py")), ids=rel)
def test_only_the_cli_prints(path: Path) -> None:
    if rel(path).startswith("supervisor/cli/"):
        return
    calls = [
        n
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
    ]
    assert not calls, f"{rel(path)} calls print(); return values and let the CLI print"
