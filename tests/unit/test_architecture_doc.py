"""docs/architecture.md stays true for the next engineer: its Layout names every module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = [
    "supervisor",
    "supervisor/config",
    "supervisor/run",
    "supervisor/store",
    "supervisor/observe",
    "workers",
]


def layout() -> str:
    text = DOC.read_text()
    section = text[text.index("## Layout") :]
    section = section[: section.index("\n## ", 1)]
    (block,) = re.findall(r"```\n(.*?)```", section, re.S)
    return block


@pytest.mark.parametrize(
    "module",
    [
        f"{package}/{path.name}"
        for package in PACKAGES
        for path in sorted((ROOT / package).glob("*.py"))
        if path.name not in ("__main__.py",)
        and not (path.name == "__init__.py" and package != "supervisor/store")
    ],
)
def test_the_layout_names_every_module(module: str) -> None:
    name = Path(module).name
    assert re.search(rf"(?<![\w/]){re.escape(name)}\b", layout()), (
        f"docs/architecture.md's Layout does not name {module}: say what it owns"
    )
