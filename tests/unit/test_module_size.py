"""Small modules that own one noun: none of fleetd's over LIMIT lines. A module that grows past
it is split along its seams (docs/architecture.md names where each noun lives)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 500
PACKAGES = ("supervisor", "workers")


def test_no_module_over_the_limit() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    over = {name: lines for name, lines in sizes.items() if lines > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them along their seams): {over}"
