"""docs/architecture.md stays true for the next engineer: its map names every package, and its
Layout tree names every module where it lives, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
TOP = ("supervisor", "workers")


def block(heading: str) -> str:
    """The first code block of the section ``heading``."""
    text = DOC.read_text()
    section = text[text.index(f"## {heading}\n") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```\n(.*?)```", section, re.S)[0]


def packages() -> set[str]:
    return {
        init.parent.relative_to(ROOT).as_posix()
        for top in TOP
        for init in (ROOT / top).rglob("__init__.py")
    }


def modules() -> set[str]:
    """Every module a reader must find: all but ``__main__`` and the empty ``__init__``s."""
    return {
        path.relative_to(ROOT).as_posix()
        for top in TOP
        for path in (ROOT / top).rglob("*.py")
        if path.name != "__main__.py"
        and not (path.name == "__init__.py" and not path.read_text().strip())
    }


def layout_tree() -> set[str]:
    """The paths the Layout tree names: each line's first word, under the folders above it
    (two spaces a level; a wider indent continues the line before)."""
    named: set[str] = set()
    folders: list[str] = []
    for line in block("Layout").splitlines():
        match = re.match(r"^( *)(\S+)", line)
        if not match or len(match.group(1)) > 2 * len(folders):
            continue  # a blank line, or the rest of the line before
        depth = len(match.group(1)) // 2
        folders, name = folders[:depth], match.group(2)
        path = "/".join([*folders, name.rstrip("/")])
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        named.add(path)
    return named


def test_the_map_names_every_package() -> None:
    in_map = set(re.findall(r"^(\S+)/ ", block("The map"), re.M))
    missing = packages() - in_map
    assert not missing, f"docs/architecture.md's map does not name {sorted(missing)}"


def test_the_layout_names_every_module_where_it_lives() -> None:
    named = layout_tree()
    missing = modules() - named
    assert not missing, f"docs/architecture.md's Layout does not name {sorted(missing)}"


def test_the_layout_names_nothing_that_is_gone() -> None:
    gone = {
        path
        for path in layout_tree()
        if path.endswith(".py") and path.split("/")[0] in TOP and not (ROOT / path).exists()
    }
    assert not gone, f"docs/architecture.md's Layout names modules that do not exist: {gone}"
