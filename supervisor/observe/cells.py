"""Pure: the status view's cells. Short durations, sizes and rates, usage bars, text made safe
for the operator's terminal (``plain``), and the one-line ``Text`` every row is built from.
"""

from __future__ import annotations

from rich.text import Text

SELECTED = "reverse"  # the interactive view's selected pool or job


def dur(seconds: float | None) -> str:
    """Short durations: ``350ms``, ``3.2s``, ``2m03s``, ``1h02m``, ``-``."""
    if seconds is None:
        return "-"
    if seconds < 0.001:
        return "<1ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    if seconds < 3600:
        secs = int(seconds % 60)
        return f"{int(seconds // 60)}m{secs:02d}s" if secs else f"{int(seconds // 60)}m"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600):02d}h"


def size(n: int | None) -> str:
    """Short sizes: ``212M``, ``1.5G``, ``-``."""
    if n is None:
        return "-"
    mib = n / (1024 * 1024)
    if mib < 1024:
        return f"{mib:.0f}M"
    return f"{mib / 1024:.1f}G"


def rate(r: float) -> str:
    return f"{r:.1f}/s" if r < 100 else f"{r:.0f}/s"


def bar(fraction: float | None, width: int) -> Text:
    """``▇▇▇░░`` in green, yellow (70 %) or red (90 %); blank when unknown."""
    if fraction is None or width <= 0:
        return Text(" " * max(0, width))
    f = max(0.0, min(1.0, fraction))
    full = round(f * width)
    style = "red" if fraction >= 0.9 else "yellow" if fraction >= 0.7 else "green"
    return Text("▇" * full, style=style) + Text("░" * (width - full), style="dim")


def plain(text: str) -> str:
    """``text`` safe to put on the operator's terminal: each control or other unprintable
    character shown as its ``\\x..`` escape instead (an escape sequence in a tenant, a kind or
    an error message would otherwise recolour the screen, retitle the window or move the
    cursor: jobs are hostile and so is what they write). Rich markup is not this function's
    business: strings from the fleet go to rich as ``Text``, which is never parsed as markup.

    >>> plain("acme"), plain("\\x1b[31mred\\x07")
    ('acme', '\\\\x1b[31mred\\\\x07')
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def line(*parts: Text | str, style: str = "") -> Text:
    text = Text(no_wrap=True, overflow="ellipsis", style=style)
    for part in parts:
        text.append_text(part) if isinstance(part, Text) else text.append(part)
    return text
