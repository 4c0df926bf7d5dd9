"""The interactive ``fleetd status`` frame: ``draw(state, view, width, height)``, pure (a
``liveview.State`` and a ``FleetView`` in, a rich renderable out).

Top to bottom: the screen of the mode (the status view of supervisor/observe/status_view.py
with the selected pool or job in reverse video; the dead letters of a pool; or the keys), then
one status line (a question, the filter being typed, what the last key did, or what the
selection is and what to press), then one footer line with the screen's keys. The frame keeps
to ``height`` lines: the status view's worker rows and the dead letters are cut to fit.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from supervisor.observe import liveview, status_view
from supervisor.observe.cells import SELECTED, plain
from supervisor.observe.fleetview import FleetView
from supervisor.observe.liveview import DeadRow, Mode, State

CHROME = 2  # the status line and the footer
_LINE_STYLE = {
    "ask": "bold yellow",
    "typing": "bold",
    "said": "bold green",
    "trouble": "bold red",
    "hint": "cyan",
}


# ---- what the status line and the footer say ---------------------------------------------


def describe(state: State) -> str:
    """The status line when nothing else is to be said: what is selected and what to do."""
    shown = f"[only {state.filter}] " if state.filter else ""
    if state.dead_pool is not None:
        dead = state.dead_row
        if dead is None:
            return f"{shown}no dead letter in pool {state.dead_pool} — Esc back"
        return f"{shown}dead job {dead.job} ({dead.kind}): r requeues it, x purges it"
    row = state.row
    if row is None:
        return f"{shown}nothing to select"
    if row.job is None:
        verb = "resumes" if row.paused else "pauses"
        return f"{shown}pool {row.pool}: p {verb} it, d opens its dead letters"
    return f"{shown}job {row.job} ({row.kind} on {row.host}): c cancels it"


# ---- the keys, for ? and the footer ----------------------------------------------------------

KEYS = (
    ("↑ ↓  j k", "select a pool or a running job (PgUp PgDn, g G: further)"),
    ("p", "pause the selected pool on every host; p again resumes it"),
    ("c", "cancel the selected running job (asks y/n first)"),
    ("d", "the dead letters of the selected pool; Esc or d back"),
    ("  r", "requeue the selected dead letter (a fresh delivery budget)"),
    ("  x", "purge the selected dead letter (asks y/n first)"),
    ("/", "show only a kind or tenant: type it, Enter; / then Esc shows all"),
    ("?", "these keys; any key closes them"),
    ("q  Esc  Ctrl-C", "quit (Esc goes back first from the dead letters)"),
)

FOOTER = {
    Mode.MAIN: "↑↓/jk select  p pause  c cancel  d dead letters  / filter  ? keys  q quit",
    Mode.DEAD: "↑↓/jk select  r requeue  x purge  p pause  / filter  Esc back  q quit",
}


def footer(state: State) -> str:
    """The keys of the screen under whatever is asked or typed."""
    if state.mode is Mode.FILTER:
        return "type a kind or a tenant  Enter apply  Esc show all  Backspace erase"
    if state.mode is Mode.CONFIRM:
        return "y yes  any other key: no"
    if state.mode is Mode.HELP:
        return "any key closes the keys  q quit"
    return FOOTER[Mode.DEAD if state.dead_pool is not None else Mode.MAIN]


def status_line(state: State) -> tuple[str, str]:
    """(text, what it is): ``ask`` a question, ``typing`` the filter, ``said`` what an
    action did, ``trouble`` why the frame is old, or ``hint`` the selection."""
    if state.mode is Mode.CONFIRM:
        return state.prompt, "ask"
    if state.mode is Mode.FILTER:
        return f"only kind or tenant: {state.typing}▏", "typing"
    if state.message:
        return state.message, "said"
    if state.trouble:
        return state.trouble, "trouble"
    return describe(state), "hint"


# ---- the frame -----------------------------------------------------------------------------


def body_height(height: int) -> int:
    """Lines left for the screen above the status line and the footer."""
    return max(1, height - CHROME)


def dead_room(height: int) -> int:
    """Dead letters that fit a frame ``height`` lines high (title, heading, table header,
    and a line for "... more")."""
    return max(1, body_height(height) - 4)


def main_rows(state: State, view: FleetView, width: int, height: int) -> tuple[liveview.Row, ...]:
    """The selectable rows the main screen shows for this state (its filter) and size."""
    keep = liveview.keeps(state.filter)
    shown = status_view.shown_workers(view, width, body_height(height), keep)
    return liveview.screen_rows(view.pools, shown)


def draw(state: State, view: FleetView, width: int, height: int) -> RenderableType:
    """The whole interactive frame, ``width`` × at most ``height`` lines."""
    room = body_height(height)
    screen = state.back if state.mode in (Mode.FILTER, Mode.CONFIRM, Mode.HELP) else state.mode
    if state.mode is Mode.HELP:
        body: RenderableType = _help(view)
    elif screen is Mode.DEAD and state.dead_pool is not None:
        body = _dead_screen(state, view, height)
    else:
        row = state.row
        body = status_view.render(
            view,
            width,
            room,
            selected_pool=row.pool if row is not None and row.job is None else None,
            selected_job=row.job if row is not None else None,
            keep=liveview.keeps(state.filter),
        )
    text, what = status_line(state)
    style = "bold red" if what == "said" and text.startswith("could not") else _LINE_STYLE[what]
    return Group(
        body,
        Text(plain(text), style=style, no_wrap=True, overflow="ellipsis"),
        Text(footer(state), style="dim", no_wrap=True, overflow="ellipsis"),
    )


def _help(view: FleetView) -> RenderableType:
    table = Table(box=None, show_header=False, pad_edge=False, expand=False)
    table.add_column(no_wrap=True, style="bold")
    table.add_column(overflow="fold")
    for keys, what in KEYS:
        table.add_row(keys, what)
    heading = Text("keys of fleetd status (every action says what it did below)", style="bold")
    return Group(status_view.title(view), heading, table)


def _dead_screen(state: State, view: FleetView, height: int) -> RenderableType:
    pool = state.dead_pool
    only = f" of kind or tenant {state.filter}" if state.filter else ""
    count = state.dead_count
    heading = Text(
        plain(f"dead letters of pool {pool}{only}: {count}" + (", oldest first" if count else "")),
        style="bold",
        no_wrap=True,
        overflow="ellipsis",
    )
    parts: list[RenderableType] = [status_view.title(view), heading]
    if not state.dead:
        parts.append(Text("none", style="dim"))
        return Group(*parts)
    shown = state.dead[: dead_room(height)]
    parts.append(_dead_table(shown, state.dead_selected))
    if count > len(shown):
        more = f"… {count - len(shown)} more (requeue or purge these, or fleetd dlq list)"
        parts.append(Text(more, style="dim", no_wrap=True, overflow="ellipsis"))
    return Group(*parts)


def _dead_table(rows: tuple[DeadRow, ...], selected: int | None) -> Table:
    # the last error takes what the other columns leave (ratio), so they are never squeezed
    table = Table(box=None, header_style="bold", pad_edge=False, expand=True)
    for name, width in (
        ("job", None),
        ("kind", 14),
        ("tenant", 12),
        ("died of", 13),
        ("ago", None),
        ("tries", None),
    ):
        table.add_column(
            name, no_wrap=True, overflow="ellipsis", max_width=width, min_width=len(name)
        )
    table.add_column("last error", no_wrap=True, overflow="ellipsis", ratio=1, min_width=10)
    for d in rows:
        # Text, never str: a str cell is read as rich markup, and a tenant or an error
        # message is whatever a job wrote ("[/bold]" in one would raise)
        table.add_row(
            str(d.job),
            Text(plain(d.kind)),
            Text(plain(d.tenant or "")),
            d.error_kind or "",
            liveview.short(d.died_ago),
            str(d.attempts),
            Text(plain((d.last_error or "").replace("\n", " "))),
            style=SELECTED if d.job == selected else None,
        )
    return table
