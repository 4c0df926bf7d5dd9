"""The ``fleetd status`` screen: ``render(view, width, height)`` is pure (a ``FleetView`` in, a
rich renderable out), and ``watch`` is the small ``Live`` driver the command runs.

Layout, top to bottom: one title line with the fleet's health; per pool its workers, sizing
and queue (one table row each from 120 columns, two or three lines each below that); one line
per node (gone nodes in red); problems; then one row per worker, with elapsed time against the
timeout and RSS against the memory limit as bars. When ``height`` is given the worker rows are
cut to fit: the ones that matter first (wedged, near their memory limit or timeout, busy),
then one line that counts the rest per pool and state.

``watch`` redraws with ``Live(auto_refresh=False)``: no refresh thread, one frame per
``interval``. It runs in the ``status`` command only, which never forks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from supervisor.model import iso
from supervisor.observe.fleetview import FleetView, NodeView, PoolSummary, WorkerRow
from supervisor.observe.health import wedged
from supervisor.observe.snapshot import PoolView
from supervisor.units import format_rate

WIDE = 120
SELECTED = "reverse"  # the interactive view's selected pool or job
LEVEL_STYLE = {"green": "green", "amber": "yellow", "red": "bold red"}


# ---- small formatters ---------------------------------------------------------------------


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


def _line(*parts: Text | str, style: str = "") -> Text:
    text = Text(no_wrap=True, overflow="ellipsis", style=style)
    for part in parts:
        text.append_text(part) if isinstance(part, Text) else text.append(part)
    return text


# ---- sections -----------------------------------------------------------------------------


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
    return _line(Text("fleetd ", style="bold"), f"{view.fleet} · {nodes} · {when}Z  ", mark)


def _sizing(p: PoolSummary) -> Text:
    text = Text(f"want {p.desired} max {p.ceiling}")
    text.append(f" ({p.binding})", style="dim")
    if p.saturated:
        text.append(" SATURATED", style="bold red")
    if p.draining:
        text.append(" DRAINING", style="bold yellow")
    if p.paused:
        text.append(" PAUSED", style="bold magenta")
    elif p.paused_kinds:
        text.append(f" PAUSED {','.join(p.paused_kinds)}", style="bold magenta")
    return text


def _oldest(p: PoolSummary, label: str = "oldest ") -> Text:
    if p.ready is None:
        return Text(f"{label}?", style="dim")
    style = LEVEL_STYLE[p.age_level]
    age = dur(p.oldest_age) if p.ready else "-"
    return Text(f"{label}{age}/{dur(p.latency_target)} ●", style=style)


def _backlog(p: PoolSummary, held: bool = False) -> str:
    """``backlog 200 +3 later``; with ``held``, ``held by rate`` after it when it is."""
    if p.ready is None:
        return "backlog ?"
    more = "+" if p.counts_capped else ""  # the store stops counting at its cap
    later = f" +{p.scheduled}{more} later" if p.scheduled else ""
    rated = " held by rate" if held and p.rate_held else ""
    return f"backlog {p.ready}{more}{later}{rated}"


def _held_by_rate(p: PoolSummary) -> str:
    """The note of a pool whose ready jobs wait for rate-limit tokens (80 columns)."""
    # the limit as configured ("1/h", "600/m"): per second it would read "0.0/s"
    limit = (
        f" ({format_rate(p.rate_limit)} fleet-wide)" if p.rate_limit is not None else " (a kind's)"
    )
    return f"held by rate{limit}"


def _rss(p: PoolSummary) -> str:
    return f"RSS p95 {size(p.peak_rss_p95)}/{size(p.memory_limit) if p.memory_limit else '∞'}"


def _at_rest(p: PoolSummary, compact: bool = False) -> str:
    """``5M + 40M shared`` (compact: ``5M+40M``): a ready worker as the kernel counts it, its
    private pages and those every worker of the pool shares (counted once by the sizing)."""
    if p.private_at_rest is None or p.shared_baseline is None:
        return "-"
    if compact:
        return f"{size(p.private_at_rest)}+{size(p.shared_baseline)}"
    return f"{size(p.private_at_rest)} + {size(p.shared_baseline)} shared"


def _recent(p: PoolSummary, compact: bool = False) -> str:
    r = p.recent
    parts = [
        (r.get("redeliveries", 0), "redelivered"),
        (r.get("failures", 0), "failed"),
        (r.get("dead_letters", 0), "dead"),
        (r.get("kills", 0), "killed"),
    ]
    if compact:
        return "/".join(str(n) for n, _ in parts)
    return " · ".join(f"{n} {what}" for n, what in parts if n)


def _workers(p: PoolSummary) -> Text:
    text = Text(f"{p.busy} busy", style="bold" if p.busy else "")
    text.append(f" {p.idle} idle /{p.provisioned}")
    if p.slots > 1:  # workers of several slots: the jobs are the concurrency
        text.append(f" · {p.running}/{p.provisioned * p.slots} slots")
    if p.starting or p.stopping:
        text.append(f" ({p.starting} starting, {p.stopping} stopping)", style="dim")
    return text


def _pool_lines(p: PoolSummary, selected: bool = False) -> list[Text]:
    lines = [
        _line(
            Text(f"{p.name:<12}", style="bold cyan"),
            _workers(p),
            "  ",
            _sizing(p),
            "  ",
            _oldest(p),
            style=SELECTED if selected else "",
        ),
        _line(
            f"  {_backlog(p)} · in {rate(p.arrival_rate)} out {rate(p.throughput)} · "
            f"p50 {dur(p.duration_p50)} p95 {dur(p.duration_p95)} · {_rss(p)}"
        ),
    ]
    if p.private_at_rest is not None and p.shared_baseline is not None:
        lines.append(_line(f"  at rest: a worker {_at_rest(p)}, counted once"))
    notes = []
    if any(p.recent.values()):
        notes.append(f"5m: {_recent(p)}")
    if p.unserved_kinds:
        notes.append(f"no live node handles {', '.join(p.unserved_kinds)}")
    if p.nodes == 0:
        notes.append("no running supervisor")
    if p.cancelled:
        notes.append(f"{p.cancelled} cancelled")
    if p.rate_held:
        notes.append(_held_by_rate(p))
    if p.paused or p.paused_kinds:
        notes.append(f"paused since {(p.paused_since or '')[11:19]}Z (fleetd resume)")
    if notes:
        lines.append(_line(Text("  " + " · ".join(notes), style="yellow")))
    return lines


def _pool_table(pools: tuple[PoolSummary, ...], selected: str | None = None) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    for name in (
        "pool",
        "workers",
        "sizing",
        "backlog",
        "oldest/target",
        "in · out",
        "p50 · p95",
        "RSS p95/limit",
        "5m redeliv/fail/dead/kill",
    ):
        table.add_column(name, no_wrap=True, overflow="ellipsis")
    at_rest = any(p.private_at_rest is not None for p in pools)
    if at_rest:  # smaps of a ready worker: what one costs, and what all share once
        table.add_column("at rest", no_wrap=True, overflow="ellipsis")
    for p in pools:
        unserved = f" (no node: {','.join(p.unserved_kinds)})" if p.unserved_kinds else ""
        table.add_row(
            Text(p.name + unserved, style="bold cyan"),
            _workers(p),
            _sizing(p),
            _backlog(p, held=True)[8:],
            _oldest(p, label=""),
            f"{rate(p.arrival_rate)} · {rate(p.throughput)}",
            f"{dur(p.duration_p50)} · {dur(p.duration_p95)}",
            _rss(p)[8:],
            _recent(p, compact=True),
            *([_at_rest(p, compact=True)] if at_rest else []),
            style=SELECTED if p.name == selected else None,
        )
    return table


def _node_line(n: NodeView) -> Text:
    where = f"{plain(n.hostname)}:{n.pid}"
    if n.status == "gone":
        return _line(
            Text(f"✗ {plain(n.node_id)}", style="bold red"),
            f"  {where}  ",
            Text(f"GONE: no heartbeat for {dur(n.heartbeat_age)}", style="red"),
        )
    if n.status == "stopped":
        return _line(
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
    return _line(
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
        lines.append(_line(Text(where, style="bold red"), Text(p.detail, style="red")))
    if len(problems) > limit:
        lines.append(
            _line(Text(f"! … {len(problems) - limit} more (fleetd check --live)", style="red"))
        )
    return lines


def _schedule_lines(view: FleetView) -> list[Text]:
    """Schedules whose last tick failed or that are late; the others say nothing here."""
    return [
        _line(
            Text(f"! schedule {s.name}: ", style="bold yellow"),
            Text(s.detail(), style="yellow"),
        )
        for s in view.schedules
        if s.problem
    ]


# ---- workers ------------------------------------------------------------------------------


def _severity(row: WorkerRow, pools: dict[tuple[str, str], PoolView]) -> tuple[float, ...]:
    """Sort key: wedged first, then nearest to a limit, then busy before idle."""
    w = row.worker
    pool = pools.get((row.node_id, w.pool))
    is_wedged = pool is not None and wedged(w, pool) is not None
    mem = (w.rss or 0) / row.memory_limit if row.memory_limit and w.state == "busy" else 0.0
    elapsed = (w.elapsed or 0.0) / w.timeout if w.timeout and w.elapsed is not None else 0.0
    order = {"busy": 0, "stopping": 1, "starting": 2, "idle": 3}.get(w.state, 4)
    return (-float(is_wedged), -max(mem, elapsed), order, w.pid)


def _worker_table(
    rows: list[WorkerRow], wide: bool, many_hosts: bool, width: int, selected: int | None = None
) -> Table:
    bar_w = 10 if wide else 6
    table = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    columns = ["host"] if (wide or many_hosts) else []
    columns += ["worker", "pid", "state", "job", "kind", "elapsed/timeout", "RSS/limit"]
    for name in columns:
        table.add_column(
            name,
            no_wrap=True,
            overflow="ellipsis",
            max_width=max(6, width // 6) if name in ("host", "kind") else None,
        )
    for row in rows:
        w = row.worker
        frac = w.elapsed / w.timeout if w.elapsed is not None and w.timeout else None
        mem = w.rss / row.memory_limit if w.rss is not None and row.memory_limit else None
        elapsed = (
            bar(frac, bar_w) + Text(f" {dur(w.elapsed)}/{dur(w.timeout)}")
            if w.elapsed is not None
            else Text("")
        )
        limit = size(row.memory_limit) if row.memory_limit else "∞"
        rss = bar(mem, bar_w) + Text(f" {size(w.rss)}/{limit}")
        state = Text(w.state, style={"busy": "bold", "stopping": "yellow"}.get(w.state, "dim"))
        if w.kill:
            state = Text(f"kill:{w.kill}", style="bold red")
        # names as Text: a str cell is read as rich markup ("[/x]" in a kind would raise)
        cells: list[Text | str] = [Text(plain(row.hostname))] if (wide or many_hosts) else []
        kind = Text(plain(w.kind or ""))
        cells += [Text(plain(w.name)), str(w.pid), state, str(w.job or ""), kind, elapsed, rss]
        chosen = selected is not None and w.job == selected
        table.add_row(*cells, style=SELECTED if chosen else None)
    return table


def _collapsed(hidden: list[WorkerRow]) -> Text:
    by_state = Counter(r.worker.state for r in hidden)
    by_pool = Counter(r.worker.pool for r in hidden)
    states = ", ".join(f"{n} {s}" for s, n in by_state.most_common())
    pools = ", ".join(f"{p} {n}" for p, n in by_pool.most_common())
    return _line(Text(f"… {len(hidden)} more workers: {states} ({pools})", style="dim"))


# ---- the screen ---------------------------------------------------------------------------


def _head(
    view: FleetView, width: int, height: int | None, selected_pool: str | None
) -> tuple[list[RenderableType], int]:
    """Everything above the worker table, and how many lines it takes."""
    parts: list[RenderableType] = [title(view)]
    used = 1
    if width >= WIDE:
        parts.append(_pool_table(view.pools, selected_pool))
        used += 1 + len(view.pools)
    else:
        for p in view.pools:
            lines = _pool_lines(p, p.name == selected_pool)
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
            _line(Text(f"  ({view.hidden_nodes} old node rows not shown)", style="dim"))
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


def _worker_rows(
    view: FleetView, height: int | None, used: int, keep: Callable[[WorkerRow], bool] | None
) -> tuple[list[WorkerRow], list[WorkerRow]]:
    """The worker rows in screen order (those that matter first), cut to what fits below
    ``used`` lines: (shown, hidden). ``keep`` filters them first."""
    rows = [r for r in view.workers if keep is None or keep(r)]
    pools = {
        (n.node_id, name): pv
        for n in view.nodes
        if n.snapshot is not None
        for name, pv in n.snapshot.pools.items()
    }
    rows.sort(key=lambda r: _severity(r, pools))
    room = len(rows) if height is None else max(0, height - used - 2)  # header, "more" line
    if room >= len(rows):
        return rows, []
    return rows[:room], rows[room:]


def shown_workers(
    view: FleetView,
    width: int,
    height: int | None,
    keep: Callable[[WorkerRow], bool] | None = None,
) -> list[WorkerRow]:
    """The worker rows ``render`` shows with these arguments, in screen order."""
    _, used = _head(view, width, height, None)
    return _worker_rows(view, height, used, keep)[0]


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
    shown, hidden = _worker_rows(view, height, used, keep)
    many_hosts = len({r.hostname for r in (*shown, *hidden)}) > 1
    if shown:
        parts.append(_worker_table(shown, width >= WIDE, many_hosts, width, selected_job))
    if hidden:
        parts.append(_collapsed(hidden))
    return Group(*parts)


# ---- the live driver ----------------------------------------------------------------------


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
