"""Pure: the status view's worker rows. Sorted so the ones that matter come first (wedged, near
their memory limit or timeout, busy), cut to the room left (``worker_rows``), shown as a table
with elapsed time and RSS as bars (``worker_table``), the cut ones counted in one line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from rich.table import Table
from rich.text import Text

from supervisor.observe.cells import SELECTED, bar, dur, line, plain, size
from supervisor.observe.fleetview import FleetView, WorkerRow
from supervisor.observe.health import wedged
from supervisor.observe.snapshot import PoolView


def _severity(row: WorkerRow, pools: dict[tuple[str, str], PoolView]) -> tuple[float, ...]:
    """Sort key: wedged first, then nearest to a limit, then busy before idle."""
    w = row.worker
    pool = pools.get((row.node_id, w.pool))
    is_wedged = pool is not None and wedged(w, pool) is not None
    mem = (w.rss or 0) / row.memory_limit if row.memory_limit and w.state == "busy" else 0.0
    elapsed = (w.elapsed or 0.0) / w.timeout if w.timeout and w.elapsed is not None else 0.0
    order = {"busy": 0, "stopping": 1, "starting": 2, "idle": 3}.get(w.state, 4)
    return (-float(is_wedged), -max(mem, elapsed), order, w.pid)


def worker_table(
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


def collapsed(hidden: list[WorkerRow]) -> Text:
    by_state = Counter(r.worker.state for r in hidden)
    by_pool = Counter(r.worker.pool for r in hidden)
    states = ", ".join(f"{n} {s}" for s, n in by_state.most_common())
    pools = ", ".join(f"{p} {n}" for p, n in by_pool.most_common())
    return line(Text(f"… {len(hidden)} more workers: {states} ({pools})", style="dim"))


def worker_rows(
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
