"""Pure: the keys of the interactive ``fleetd status``. What is selected, which screen is up,
and what a key does: ``on_key(state, key) -> (state, action)``. The driver
(supervisor/observe/terminal.py) reads the keys, performs the action (supervisor/livecontrols.py)
and hands back the line it got (``on_done``); each refresh hands in the rows on screen
(``with_rows``, ``with_dead``). Nothing here reads the terminal, the clock or the database.

Screens and their keys::

    main  ──d──> dead letters of the selected pool ──Esc or d──> main
      │            r requeue, x purge (asks y/n)
      ├──c──> "cancel job 812 (...)? y/n" ──y──> Cancel; any other key: nothing done
      ├──p──> Pause or Resume of the selected pool (fleet-wide, as fleetd pause/resume)
      ├──/──> typing a kind or tenant ──Enter: filter on it; Esc: no filter──> back
      └──?──> the keys ──any key──> back          q quits from any screen but a question

The selection is kept by identity, never by row index: a pool by name, a job by id. A job that
ended hands the selection to its pool; a dead letter that went away (requeued, purged) to the
one that took its place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from supervisor.model import Job
from supervisor.observe.fleetview import PoolSummary, WorkerRow

PAGE = 10  # rows PgUp and PgDn move
PRINTABLE_LIMIT = 64  # characters a filter may have


class Mode(StrEnum):
    MAIN = "main"  # pools and running jobs
    DEAD = "dead"  # the dead letters of one pool
    FILTER = "filter"  # typing the filter (a kind or a tenant)
    CONFIRM = "confirm"  # a y/n question before a cancel or a purge
    HELP = "help"  # the keys


@dataclass(frozen=True, slots=True)
class Row:
    """A selectable row of the main screen: a pool (``job`` None) or a running job."""

    pool: str
    job: int | None = None
    kind: str | None = None
    tenant: str | None = None
    elapsed: float | None = None  # seconds the job has run
    host: str | None = None
    paused: bool = False  # the pool is paused whole (fleetd pause POOL)

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.pool, self.job)


@dataclass(frozen=True, slots=True)
class DeadRow:
    """One dead letter as the dead-letter screen lists it."""

    job: int
    kind: str
    tenant: str | None
    error_kind: str | None
    attempts: int
    died_ago: float | None  # seconds since it died, by the database's clock
    last_error: str | None

    @classmethod
    def of(cls, job: Job, now: float) -> DeadRow:
        """``now``: the database's time of the read (Unix seconds)."""
        return cls(
            job=job.id,
            kind=job.kind,
            tenant=job.tenant,
            error_kind=str(job.error_kind) if job.error_kind else None,
            attempts=job.attempts,
            died_ago=max(0.0, now - job.finished_at) if job.finished_at is not None else None,
            last_error=job.last_error,
        )


# ---- actions: what the driver performs ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pause:
    pool: str


@dataclass(frozen=True, slots=True)
class Resume:
    pool: str


@dataclass(frozen=True, slots=True)
class Cancel:
    job: int


@dataclass(frozen=True, slots=True)
class Requeue:
    job: int


@dataclass(frozen=True, slots=True)
class Purge:
    job: int


@dataclass(frozen=True, slots=True)
class Reload:
    """Read the view (and the dead letters) again now, writing nothing."""


Action = Pause | Resume | Cancel | Requeue | Purge | Reload
WRITES = (Pause, Resume, Cancel, Requeue, Purge)  # actions that change the database


@dataclass(frozen=True, slots=True)
class State:
    """The interactive view between two keys. ``rows`` and ``dead`` are what the last
    refresh put on screen, in screen order."""

    mode: Mode = Mode.MAIN
    back: Mode = Mode.MAIN  # the screen FILTER, CONFIRM and HELP return to
    rows: tuple[Row, ...] = ()
    selected: tuple[str, int | None] | None = None  # a Row's key
    dead_pool: str | None = None  # set while the dead letters of a pool are open
    dead: tuple[DeadRow, ...] = ()
    dead_count: int = 0  # dead letters matching, all of them (``dead`` is the first ones)
    dead_selected: int | None = None  # a job id
    filter: str = ""  # a kind or tenant: only its jobs and dead letters are shown
    typing: str = ""  # the filter being typed
    prompt: str = ""  # the question CONFIRM asks
    pending: Action | None = None  # what y does
    message: str = ""  # the status line: what the last action did (until the next key)
    trouble: str = ""  # why the last read failed (until a read succeeds)
    quit: bool = False

    @property
    def row(self) -> Row | None:
        """The selected row of the main screen."""
        return next((r for r in self.rows if r.key == self.selected), None)

    @property
    def dead_row(self) -> DeadRow | None:
        return next((d for d in self.dead if d.job == self.dead_selected), None)

    @property
    def pool(self) -> str | None:
        """The pool keys act on: the dead letters' pool, or the selected row's."""
        if self.dead_pool is not None:
            return self.dead_pool
        row = self.row
        return row.pool if row is not None else None


# ---- refreshes --------------------------------------------------------------------------------


def screen_rows(pools: Sequence[PoolSummary], workers: Sequence[WorkerRow]) -> tuple[Row, ...]:
    """The selectable rows of a frame, in screen order: the pools, then the workers on
    screen that run a job."""
    rows = [Row(p.name, paused=p.paused) for p in pools]
    for r in workers:
        w = r.worker
        if w.job is not None:
            rows.append(Row(w.pool, w.job, w.kind, w.tenant, w.elapsed, r.hostname))
    return tuple(rows)


def keeps(text: str) -> Callable[[WorkerRow], bool] | None:
    """The worker filter of ``/``: a running job whose kind or tenant is ``text`` (None:
    every worker). Idle workers are hidden while a filter is on."""
    if not text:
        return None
    return lambda r: text in (r.worker.kind, r.worker.tenant)


def with_rows(state: State, rows: tuple[Row, ...]) -> State:
    """The rows of a new frame. The selection stays on its pool or job; a job no longer on
    screen hands it to its pool; a pool gone, or no selection yet, to the first pool."""
    keys = {r.key for r in rows}
    selected = state.selected
    if selected not in keys:
        if selected is not None and (selected[0], None) in keys:
            selected = (selected[0], None)
        else:
            selected = rows[0].key if rows else None
    return replace(state, rows=rows, selected=selected)


def with_dead(state: State, dead: tuple[DeadRow, ...], count: int) -> State:
    """The dead letters of a new read. A selected one that went away (requeued, purged)
    hands the selection to the one now in its place."""
    ids = [d.job for d in dead]
    chosen = state.dead_selected
    if chosen not in ids:
        old = [d.job for d in state.dead]
        at = old.index(chosen) if chosen in old else 0
        chosen = ids[min(at, len(ids) - 1)] if ids else None
    return replace(state, dead=dead, dead_count=count, dead_selected=chosen)


def on_done(state: State, line: str) -> State:
    """What an action said, for the status line."""
    return replace(state, message=line)


# ---- keys -------------------------------------------------------------------------------------

MOVES = {"up": -1, "k": -1, "down": 1, "j": 1, "pgup": -PAGE, "pgdn": PAGE}
ENDS = {"home": 0, "g": 0, "end": -1, "G": -1}


def on_key(state: State, key: str) -> tuple[State, Action | None]:
    """One key (as ``keys.decode`` names it) on the view: the new state and what to do."""
    if key == "ctrl-c":  # only seen if the terminal does not make it SIGINT
        return replace(state, quit=True), None
    handler = {
        Mode.MAIN: _main_key,
        Mode.DEAD: _dead_key,
        Mode.FILTER: _filter_key,
        Mode.CONFIRM: _confirm_key,
        Mode.HELP: _help_key,
    }[state.mode]
    return handler(state, key)


def _common(state: State, key: str) -> tuple[State, Action | None] | None:
    """Keys that do the same on the main and the dead-letter screens."""
    if key == "q":
        return replace(state, quit=True), None
    if key == "?":
        return replace(state, mode=Mode.HELP, back=state.mode, message=""), None
    if key == "/":
        return replace(state, mode=Mode.FILTER, back=state.mode, typing=state.filter), None
    if key == "p":
        return _pause(state)
    return None


def _main_key(state: State, key: str) -> tuple[State, Action | None]:
    state = replace(state, message="")
    done = _common(state, key)
    if done is not None:
        return done
    if key == "esc":
        return replace(state, quit=True), None
    if key in MOVES or key in ENDS:
        keys = [r.key for r in state.rows]
        return replace(state, selected=_moved(keys, state.selected, key)), None
    row = state.row
    if key == "c":
        if row is None or row.job is None:
            return replace(state, message="c cancels a running job: select one (↑↓ or j/k)"), None
        return _ask(state, cancel_question(row), Cancel(row.job)), None
    if key == "d":
        if row is None:
            return replace(state, message="no pool to open"), None
        opened = replace(state, mode=Mode.DEAD, dead_pool=row.pool, dead=(), dead_count=0)
        return replace(opened, dead_selected=None), Reload()
    if key in ("r", "x"):
        return replace(state, message=f"{key} acts on a dead letter: d opens them"), None
    return _unknown(state, key)


def _dead_key(state: State, key: str) -> tuple[State, Action | None]:
    state = replace(state, message="")
    done = _common(state, key)
    if done is not None:
        return done
    if key in ("esc", "d"):
        return replace(state, mode=Mode.MAIN, dead_pool=None, dead=(), dead_selected=None), None
    if key in MOVES or key in ENDS:
        ids = [d.job for d in state.dead]
        return replace(state, dead_selected=_moved(ids, state.dead_selected, key)), None
    dead = state.dead_row
    if key in ("r", "x") and dead is None:
        return replace(state, message="no dead letter selected"), None
    if key == "r" and dead is not None:
        return state, Requeue(dead.job)
    if key == "x" and dead is not None:
        return _ask(state, purge_question(dead), Purge(dead.job)), None
    if key == "c":
        return replace(state, message="c cancels a running job: Esc back to the pools"), None
    return _unknown(state, key)


def _filter_key(state: State, key: str) -> tuple[State, Action | None]:
    if key == "enter":
        text = state.typing.strip()
        said = f"showing only kind or tenant {text!r} — / then Esc shows all" if text else ""
        back = replace(state, mode=state.back, filter=text, typing="", message=said)
        return back, Reload()
    if key == "esc":
        said = "filter cleared: showing all" if state.filter else ""
        return replace(state, mode=state.back, filter="", typing="", message=said), Reload()
    if key == "backspace":
        return replace(state, typing=state.typing[:-1]), None
    if len(key) == 1 and key.isprintable() and len(state.typing) < PRINTABLE_LIMIT:
        return replace(state, typing=state.typing + key), None
    return state, None


def _confirm_key(state: State, key: str) -> tuple[State, Action | None]:
    back = replace(state, mode=state.back, prompt="", pending=None)
    if key in ("y", "Y") and state.pending is not None:
        return replace(back, message=""), state.pending
    return replace(back, message=declined(state.pending)), None


def _help_key(state: State, key: str) -> tuple[State, Action | None]:
    if key == "q":
        return replace(state, quit=True), None
    return replace(state, mode=state.back), None


def _pause(state: State) -> tuple[State, Action | None]:
    pool = state.pool
    if pool is None:
        return replace(state, message="no pool selected"), None
    row = next((r for r in state.rows if r.key == (pool, None)), None)
    if row is not None and row.paused:
        return state, Resume(pool)
    return state, Pause(pool)


def _ask(state: State, question: str, action: Action) -> State:
    return replace(state, mode=Mode.CONFIRM, back=state.mode, prompt=question, pending=action)


def _unknown(state: State, key: str) -> tuple[State, Action | None]:
    if key in ("enter", "left", "right", "tab", "backspace"):
        return state, None  # keys people press by habit; nothing to say
    return replace(state, message=f"{key!r} does nothing here: ? shows the keys"), None


def _moved(keys: list[Any], current: Any, key: str) -> Any:
    if not keys:
        return None
    if key in ENDS:
        return keys[ENDS[key]]
    at = keys.index(current) if current in keys else 0
    return keys[max(0, min(len(keys) - 1, at + MOVES[key]))]


# ---- words --------------------------------------------------------------------------------------


def short(seconds: float | None) -> str:
    """``45s``, ``3m``, ``2h05m``: how long, to the operator's eye.

    >>> short(45.2), short(190), short(7500), short(None)
    ('45s', '3m', '2h05m', '?')
    """
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def cancel_question(row: Row) -> str:
    """``cancel job 812 (render, tenant acme, running 3m on host-a)? y/n``"""
    tenant = f"tenant {row.tenant}" if row.tenant else "no tenant"
    return (
        f"cancel job {row.job} ({row.kind}, {tenant}, running {short(row.elapsed)} "
        f"on {row.host})? y/n"
    )


def purge_question(dead: DeadRow) -> str:
    """``purge dead job 17 (render, tenant acme, died 3m ago: memory_limit) for good? y/n``"""
    tenant = f"tenant {dead.tenant}" if dead.tenant else "no tenant"
    died = f"died {short(dead.died_ago)} ago" + (f": {dead.error_kind}" if dead.error_kind else "")
    return f"purge dead job {dead.job} ({dead.kind}, {tenant}, {died}) for good? y/n"


def declined(action: Action | None) -> str:
    if isinstance(action, Cancel):
        return f"not cancelled: job {action.job} runs on"
    if isinstance(action, Purge):
        return f"not purged: dead job {action.job} kept"
    return ""
