"""The ``fleetd status`` screen: ``render(view, width, height)`` is pure (a ``FleetView`` in, a
rich renderable out), and ``watch`` is the small ``Live`` driver the command runs.

Layout, top to bottom: one title line with the fleet's health; per pool its workers, sizing
and queue (poolrows.py: one table row each from 120 columns, two or three lines each below
that); one line per node (gone nodes in red); problems; then one row per worker, with elapsed
time against the timeout and RSS against the memory limit as bars (workerrows.py). When
``height`` is given the worker rows are cut to fit: the ones that matter first (wedged, near
their memory limit or timeout, busy), then one line that counts the rest per pool and state.

``watch`` redraws with ``Live(auto_refresh=False)``: no refresh thread, one frame per
``interval``. It runs in the ``status`` command only, which never forks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from supervisor.model import iso
from supervisor.observe.cells import dur, line, plain
from supervisor.observe.fleetview import FleetView, NodeView, WorkerRow
from supervisor.observe.poolrows import pool_lines, pool_table
from supervisor.observe.workerrows import collapsed, worker_rows, worker_table

WIDE = 120


def title(view: FleetView) -> Text:
    """The first line: fleet, nodes, the time of the view and the fleet's health."""
    counts = Counter(n.status for n in view.nodes)
    nodes = f"{len(view.nodes)} node{'s' if len(view.nodes) != 1 else ''}"
    extra = [f"{counts[s]} {s}" for s in ("gone", "draining", "stopped") if counts[s]]
    if extra:
        nodes += f" ({', '.join(extra)})"
    problems = len(view.verdict.problems)
    mark = (
        Text("● healthy", style="bold green")
        if view.verdict.healthy
        else Text(f"● {problems} problem{'s' if problems != 1 else ''}", style="bold red")
    )
    when = (iso(view.taken_at) or "")[11:19]
    return line(Text("fleetd ", style="bold"), f"{view.fleet} · {nodes} · {when}Z  ", mark)


def _node_line(n: NodeView) -> Text:
    where = f"{plain(n.hostname)}:{n.pid}"
    if n.status == "gone":
        return line(
            Text(f"✗ {plain(n.node_id)}", style="bold red"),
            f"  {where}  ",
            Text(f"GONE: no heartbeat for {dur(n.heartbeat_age)}", style="red"),
        )
    if n.status == "stopped":
        return line(
            Text(f"- {plain(n.node_id)}", style="dim"),
            f"  {where}  ",
            Text(f"stopped {dur(n.heartbeat_age)} ago", style="dim"),
        )
    snap = n.snapshot
    workers = sum(len(p.workers) for p in snap.pools.values()) if snap else 0
    mark = Text("● ", style="green" if n.verdict.healthy else "red")
    store = Text("")  # said only when it matters: a healthy store is the normal case
    if snap is not None and not snap.store_ok:
        store = Text(f" · STORE DOWN ({snap.store_failures} failures)", style="bold red")
    up = dur(snap.uptime) if snap else "?"
    if snap is not None and snap.recent_lease_expiries:  # the reaper serves every pool
        reaped = f" · {snap.recent_lease_expiries} leases reaped/5m"
        store = Text(reaped, style="yellow") + store
    state = Text(n.status, style="yellow" if n.status == "draining" else "")
    return line(
        mark,
        Text(plain(n.node_id), style="bold"),
        f" {where} ",
        state,
        f" hb {dur(n.heartbeat_age)} up {up} {workers} workers",
        store,
    )


def _problem_lines(view: FleetView, limit: int) -> list[Text]:
    problems = view.verdict.problems
    lines = []
    for p in problems[:limit]:
        who = " ".join(x for x in (p.node if p.node != "-" else "", p.worker or p.pool or "") if x)
        where = f"! {who}: " if who else "! "
        lines.append(line(Text(where, style="bold red"), Text(p.detail, style="red")))
    if len(problems) > limit:
        lines.append(
            line(Text(f"! … {len(problems) - limit} more (fleetd check --live)", style="red"))
        )
    return lines


def _schedule_lines(view: FleetView) -> list[Text]:
    """Schedules whose last tick failed or that are late; the others say nothing here."""
    return [
        line(
            Text(f"! schedule {s.name}: ", style="bold yellow"),
            Text(s.detail(), style="yellow"),
        )
        for s in view.schedules
        if s.problem
    ]


def _head(
    view: FleetView, width: int, height: int | None, selected_pool: str | None
) -> tuple[list[RenderableType], int]:
    """Everything above the worker table, and how many lines it takes."""
    parts: list[RenderableType] = [title(view)]
    used = 1
    if width >= WIDE:
        parts.append(pool_table(view.pools, selected_pool))
        used += 1 + len(view.pools)
    else:
        for p in view.pools:
            lines = pool_lines(p, p.name == selected_pool)
            parts.extend(lines)
            used += len(lines)
    if not view.pools:
        parts.append(Text("no pools", style="dim"))
        used += 1
    node_lines = [_node_line(n) for n in view.nodes] or [
        Text("no supervisor has registered", style="dim")
    ]
    if view.hidden_nodes:
        node_lines.append(
            line(Text(f"  ({view.hidden_nodes} old node rows not shown)", style="dim"))
        )
    parts.extend(node_lines)
    used += len(node_lines)
    problems = _problem_lines(view, 3 if height is not None and height < 40 else 8)
    parts.extend(problems)
    used += len(problems)
    schedules = _schedule_lines(view)
    parts.extend(schedules)
    used += len(schedules)
    return parts, used


def shown_workers(
    view: FleetView,
    width: int,
    height: int | None,
    keep: Callable[[WorkerRow], bool] | None = None,
) -> list[WorkerRow]:
    """The worker rows ``render`` shows with these arguments, in screen order."""
    _, used = _head(view, width, height, None)
    return worker_rows(view, height, used, keep)[0]


def render(
    view: FleetView,
    width: int = 80,
    height: int | None = None,
    *,
    selected_pool: str | None = None,
    selected_job: int | None = None,
    keep: Callable[[WorkerRow], bool] | None = None,
) -> RenderableType:
    """The whole screen for a console ``width`` columns wide; with ``height``, worker rows
    are cut so the frame fits in that many lines. The interactive view marks its selected
    pool or job (reverse video) and filters the worker rows with ``keep``."""
    parts, used = _head(view, width, height, selected_pool)
    shown, hidden = worker_rows(view, height, used, keep)
    many_hosts = len({r.hostname for r in (*shown, *hidden)}) > 1
    if shown:
        parts.append(worker_table(shown, width >= WIDE, many_hosts, width, selected_job))
    if hidden:
        parts.append(collapsed(hidden))
    return Group(*parts)


def show_once(read: Callable[[], FleetView], console: Console) -> None:
    """One frame, fitted to the terminal (all workers when not printing to a terminal)."""
    # the last line stays free: the newline after the frame would scroll its first line away
    height = console.size.height - 1 if console.is_terminal else None
    console.print(render(read(), console.size.width, height))


def watch(read: Callable[[], FleetView], console: Console, interval: float) -> None:
    """Redraw every ``interval`` seconds until interrupted (Ctrl-C). Not on a terminal (piped
    to a file or a pager) there is nothing to redraw: each frame is printed after the last,
    as ``top -b`` does, instead of one frame and then silence."""
    if not console.is_terminal:
        while True:
            show_once(read, console)
            console.file.flush()
            time.sleep(interval)
    with Live(console=console, auto_refresh=False, screen=False, transient=False) as live:
        while True:
            live.update(render(read(), console.size.width, console.size.height - 1), refresh=True)
            time.sleep(interval)
