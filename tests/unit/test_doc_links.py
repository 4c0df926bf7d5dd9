"""Every relative link in README.md and docs/*.md names a file that exists, and every #anchor a
heading of the file it points into (GitHub's anchors: lower case, punctuation dropped, spaces
to hyphens, a repeated heading numbered)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of ``page``'s headings (code blocks left out)."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        heading = re.match(r"#{1,6} (.*)", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    """Relative link targets of ``page`` outside code blocks."""
    targets = LINK.findall(FENCE.sub("", page.read_text()))
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_the_slug_rule_matches_githubs() -> None:
    page = ROOT / "docs" / "benchmarks.md"
    assert "against-other-queues-python--m-stress-bench" in anchors(page)
    assert "where-fleetd-stands" in anchors(page)


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            into = (page.parent / path).resolve() if path else page
            if not into.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and into.suffix == ".md" and anchor not in anchors(into):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_guide_is_linked_from_the_readme() -> None:
    linked = {Path(t.partition("#")[0]).name for t in links(ROOT / "README.md")}
    guide = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert not guide - linked, f"README.md does not link {sorted(guide - linked)}"
