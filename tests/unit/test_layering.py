"""The import rules of docs/architecture.md, enforced by walking every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = {
    "supervisor/policy.py",
    "supervisor/plans.py",
    "supervisor/sendplan.py",
    "supervisor/units.py",
    "supervisor/rates.py",
    "supervisor/model.py",
    "supervisor/observe/snapshot.py",
    "supervisor/observe/recorder.py",
    "supervisor/observe/health.py",
    "supervisor/observe/fleetview.py",
    "supervisor/observe/schedview.py",
    "supervisor/observe/keys.py",
    "supervisor/observe/liveview.py",
    "supervisor/observe/livescreen.py",
    "supervisor/actions.py",
    "supervisor/schedules.py",
}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Top-level names of every import in a file, including imports inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def roots(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("path", modules("workers"), ids=rel)
def test_workers_never_import_the_parent_side(path: Path) -> None:
    banned = {"supervisor", "sqlalchemy", "prometheus_client", "rich", "click", "psycopg"}
    assert not roots(imported(path)) & banned


@pytest.mark.parametrize("path", modules("supervisor"), ids=rel)
def test_sql_lives_in_the_store_and_click_in_the_cli(path: Path) -> None:
    found = roots(imported(path))
    if not rel(path).startswith("supervisor/store/"):
        assert "sqlalchemy" not in found and "psycopg" not in found
    if not rel(path).startswith("supervisor/cli/"):
        assert "click" not in found


@pytest.mark.parametrize("path", sorted(PURE), ids=str)
def test_pure_modules_do_no_io(path: str) -> None:
    assert not roots(imported(ROOT / path)) & {"os", "signal", "time", "psutil", "socket"}


@pytest.mark.parametrize("path", modules("supervisor"), ids=rel)
def test_only_the_cli_prints(path: Path) -> None:
    if rel(path).startswith("supervisor/cli/"):
        return
    calls = [
        n
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
    ]
    assert not calls, f"{rel(path)} calls print(); return values and let the CLI print"


@pytest.mark.parametrize("path", modules("supervisor/observe"), ids=rel)
def test_observe_reads_the_snapshot_not_the_supervisor(path: Path) -> None:
    """observe/ sits below run/: it never imports the loop, pools or workers."""
    assert not {n for n in imported(path) if n.startswith("supervisor.run")}
