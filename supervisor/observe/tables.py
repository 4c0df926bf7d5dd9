"""Plain tables for the CLI's listings (rich, fitted to the terminal)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from supervisor.model import Job, JobState, iso
from supervisor.observe.cells import plain
from supervisor.observe.schedview import ScheduleSummary


def _console(console: Console | None) -> Console:
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped: one line a row, for grep, not wrapped at 80
            console = Console(width=100_000)
    return console


def schedules_table(found: tuple[ScheduleSummary, ...], console: Console | None = None) -> None:
    """Print schedules: status, timing, last tick (job, state), next tick, last success."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    columns = ("schedule", "status", "kind", "when", "last tick", "job", "state", "next tick")
    for name in (*columns, "last success", "missed", "policies"):
        table.add_column(name, overflow="fold")
    for s in found:
        table.add_row(
            s.name,
            s.status,
            s.kind,
            s.timing,
            (iso(s.last_tick) or "-")[:19],
            str(s.last_job or "-"),
            s.last_state or ("-" if s.last_tick is None else "gone"),
            (iso(s.next_ticks[0]) or "-")[:19] if s.next_ticks else "-",
            (iso(s.last_success_at) or "-")[:19],
            str(s.missed),
            s.policies,
        )
    out = _console(console)
    out.print(table if found else "no schedules")
    for s in found:
        if s.status == "error":
            out.print(f"! schedule {s.name}: {s.detail()}", markup=False, highlight=False)


def jobs_table(found: list[Job], console: Console | None = None) -> None:
    """Print jobs as a table: one row each, the error for failed ones."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("id", "kind", "pool", "state", "att", "tenant", "enqueued", "error"):
        table.add_column(name, overflow="fold", no_wrap=name != "error")
    for job in found:
        error = f"{job.error_kind}: {job.last_error}" if job.error_kind else ""
        if job.state is JobState.CANCELLED and not job.error_kind:
            error = job.last_error or ""
        elif job.state is JobState.LEASED and job.cancel_requested_at is not None:
            error = "cancel requested: stopping"
        # Text, never str: a str cell is read as rich markup, and a tenant or an error is
        # whatever a job wrote ("[/bold]" in one raised MarkupError and ended the listing)
        table.add_row(
            str(job.id),
            Text(plain(job.kind)),
            Text(plain(job.pool)),
            str(job.state),
            f"{job.attempts}/{job.max_deliveries}",
            Text(plain(job.tenant or "")),
            (iso(job.enqueued_at) or "")[:19],
            Text(plain(error)),
        )
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped: one line a job, for grep, not wrapped at 80
            console = Console(width=100_000)
    console.print(table if found else "no jobs")
