"""One pass over the schedules, as the store process runs it (``SchedulePass`` of
supervisor/run/requests.py, sent on the chores link by ``run/scheduler.py``).

    read the rows (register those seen for the first time: they start now)
      └─ per schedule: the row's timing is not this config's: retime (start afresh now) or
         leave the schedule to a newer config (below)
         plan (supervisor/schedules.py, pure) ─> advance_schedule (one guarded
         transaction: move ``through``, enqueue the ticks' jobs); lost the race to another
         supervisor: read the row again and plan from there (at most ``RETRIES`` times)
    read the rows again for the report (only when something was written)

The store's clock decides what is due: the database's ``now()`` on PostgreSQL, so hosts whose
clocks disagree still agree on ticks.

A changed timing (``every = "1d"`` became ``"1m"``): the new timing's ticks since ``through``
never existed, so the row starts afresh, as a new schedule would (``retime_schedule``:
``through`` = max(through, now)); nothing is caught up or counted missed for the change.
Which config's timing the row follows: the newest, taken as that of the supervisor that
started passing last. A supervisor whose timing differs from the row's retimes it if the row's
timing was set before this supervisor's first pass (``started``: its config is the newer),
and otherwise leaves the schedule alone (a supervisor started after it set the timing: a
rolling deploy reached it), which is that schedule's ``error`` here. So during a deploy, once
a supervisor with the new timing has passed, none with the old one enqueues a tick of it (the
advance's compare-and-set includes the timing). A supervisor with the old config restarted
after that wins it back: the last one started decides.

A schedule the database refuses (a ``StoreError`` other than ``StoreUnavailable``: a value its
columns cannot hold, a constraint) is that schedule's outcome, with the reason in ``error``;
the pass goes on with the others. ``StoreUnavailable`` ends the pass (the loop backs off and
tries again), and any other exception is a bug: it ends the pass too (run/scheduler.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from supervisor import schedules
from supervisor.errors import StoreError, StoreUnavailable
from supervisor.model import ScheduleAdvance, ScheduleState
from supervisor.schedules import ScheduleSpec, TickPlan

if TYPE_CHECKING:
    from supervisor.store import Store

RETRIES = 3


@dataclass(frozen=True, slots=True)
class Passes:
    """This supervisor's earlier passes, in the store's time: ``since`` the previous one's
    now (``schedules.plan``), ``started`` the first one's (None: this is the first)."""

    since: float | None = None
    started: float | None = None


@dataclass(frozen=True, slots=True)
class ScheduleOutcome:
    """What a pass did with one schedule: its plan (``took``: this supervisor wrote it) and
    the jobs it enqueued, (tick, job id); ``error``: why this supervisor does not enqueue it
    (the database refused its write, or a newer config's timing is in the row); ``retimed``:
    the timing this pass replaced, when it started the schedule afresh."""

    name: str
    plan: TickPlan
    took: bool = False
    enqueued: tuple[tuple[float, int], ...] = ()
    error: str | None = None
    retimed: str | None = None
    adopted: tuple[float, ...] = ()  # ticks whose key named an existing job (AdvanceOutcome)


@dataclass(frozen=True, slots=True)
class PassReport:
    """A pass: the store's ``now``, each schedule's outcome, the rows after it, and the
    ``started`` it went by (the store's now at this supervisor's first pass)."""

    now: float
    outcomes: tuple[ScheduleOutcome, ...]
    states: dict[str, ScheduleState]
    started: float | None = None

    @property
    def next_tick(self) -> float | None:
        """The earliest next tick of any schedule."""
        ticks = [o.plan.next_tick for o in self.outcomes if o.plan.next_tick is not None]
        return min(ticks, default=None)


def schedule_pass(
    store: Store, specs: Sequence[ScheduleSpec], passes: Passes | None = None
) -> PassReport:
    """One pass over ``specs``, given this supervisor's earlier ``passes``."""
    names = [s.name for s in specs]
    read = store.schedule_states(names)
    refused: dict[str, str] = {}
    missing = {s.name: s.timing.fingerprint() for s in specs if s.name not in read.states}
    if missing:
        refused = _register(store, missing)
        read = store.schedule_states(names)
    passes = passes or Passes()
    if passes.started is None:
        passes = Passes(passes.since, read.now)
    outcomes = tuple(
        _refused(spec, refused[spec.name], read.now)
        if spec.name in refused
        else _isolated(store, spec, read.states[spec.name], read.now, passes)
        for spec in specs
    )
    states = read.states
    if any(o.took or o.retimed for o in outcomes):
        states = store.schedule_states(names).states
    return PassReport(read.now, outcomes, states, passes.started)


def _register(store: Store, timings: dict[str, str]) -> dict[str, str]:
    """Rows for ``timings``; those the database refuses, with why (each other one is made)."""
    try:
        store.register_schedules(timings)
        return {}
    except StoreUnavailable:
        raise
    except StoreError:  # refused: narrowed to its names below
        pass
    refused = {}
    for name, timing in timings.items():
        try:
            store.register_schedules({name: timing})
        except StoreUnavailable:
            raise
        except StoreError as exc:
            refused[name] = str(exc)
    return refused


def _isolated(
    store: Store, spec: ScheduleSpec, state: ScheduleState, now: float, passes: Passes
) -> ScheduleOutcome:
    """``_decide``, with a write the database refuses kept to this schedule's outcome."""
    try:
        return _decide(store, spec, state, now, passes)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        return _refused(spec, str(exc), now)


def _refused(spec: ScheduleSpec, why: str, now: float) -> ScheduleOutcome:
    # its next tick still paces the loop: the write is tried again then (and logged only
    # when the reason changes, run/scheduler.py)
    return ScheduleOutcome(spec.name, TickPlan(next_tick=spec.timing.after(now)), error=why)


def _decide(
    store: Store, spec: ScheduleSpec, state: ScheduleState, now: float, passes: Passes
) -> ScheduleOutcome:
    plan, retimed = TickPlan(), None
    mine = spec.timing.fingerprint()
    for _ in range(RETRIES):
        if state.timing != mine:
            if retimed is not None or state.timing_at > (passes.started or now):
                return _refused(spec, _newer(state, mine), now)
            retimed = state.timing
            store.retime_schedule(spec.name, state.timing, mine)
            fresh = store.schedule_states([spec.name])  # retimed, by this pass or another
            state, now = fresh.states[spec.name], fresh.now
            continue
        _note_success(store, state)
        plan = schedules.plan(spec, state, now, passes.since)
        if plan.through is None:
            return ScheduleOutcome(spec.name, plan, retimed=retimed)
        jobs = tuple((tick, schedules.tick_job(spec, tick)) for tick in plan.enqueue)
        advance = ScheduleAdvance(
            spec.name, state.through, plan.through, jobs, plan.not_enqueued, mine
        )
        done = store.advance_schedule(advance)
        if done.took:
            return ScheduleOutcome(
                spec.name, plan, True, done.enqueued, retimed=retimed, adopted=done.adopted
            )
        fresh = store.schedule_states([spec.name])  # another supervisor decided first
        state, now = fresh.states[spec.name], fresh.now
    return ScheduleOutcome(spec.name, TickPlan(next_tick=plan.next_tick), retimed=retimed)


def _newer(state: ScheduleState, mine: str) -> str:
    return (
        f"the database has its timing as {state.timing}, set by a supervisor started after "
        f"this one (a newer config); this one, with {mine}, leaves the schedule to it"
    )


def _note_success(store: Store, state: ScheduleState) -> None:
    """Keep the row's last success as late as any recent tick's: a done job is pruned after
    the retention, and its tick leaves the recent ones after ``TICKS_KEPT`` more."""
    latest = state.latest_success()
    if latest is not None and latest != state.last_success_at:
        store.note_schedule_success(state.name, latest)
