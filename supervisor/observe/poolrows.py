"""Pure: a pool in the status view. Below 120 columns two or three lines each (``pool_lines``:
workers, sizing, the oldest job against its target; queue and rates; memory at rest; notes),
from 120 one row each of a table (``pool_table``).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from supervisor.observe.cells import SELECTED, dur, line, rate, size
from supervisor.observe.fleetview import PoolSummary
from supervisor.units import format_rate

LEVEL_STYLE = {"green": "green", "amber": "yellow", "red": "bold red"}


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


def pool_lines(p: PoolSummary, selected: bool = False) -> list[Text]:
    lines = [
        line(
            Text(f"{p.name:<12}", style="bold cyan"),
            _workers(p),
            "  ",
            _sizing(p),
            "  ",
            _oldest(p),
            style=SELECTED if selected else "",
        ),
        line(
            f"  {_backlog(p)} · in {rate(p.arrival_rate)} out {rate(p.throughput)} · "
            f"p50 {dur(p.duration_p50)} p95 {dur(p.duration_p95)} · {_rss(p)}"
        ),
    ]
    if p.private_at_rest is not None and p.shared_baseline is not None:
        lines.append(line(f"  at rest: a worker {_at_rest(p)}, counted once"))
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
        lines.append(line(Text("  " + " · ".join(notes), style="yellow")))
    return lines


def pool_table(pools: tuple[PoolSummary, ...], selected: str | None = None) -> Table:
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
