"""One pass over the schedules, as the store process runs it (a procedure of
supervisor/run/storecalls.py, sent on the chores link by ``run/scheduler.py``).

    read the rows (register those seen for the first time: they start now)
      └─ per schedule: plan (supervisor/schedules.py, pure) ─> advance_schedule (one guarded
         transaction: move ``through``, enqueue the ticks' jobs); lost the race to another
         supervisor: read the row again and plan from there (at most ``RETRIES`` times)
    read the rows again for the report (only when something was written)

The store's clock decides what is due: the database's ``now()`` on PostgreSQL, so hosts whose
clocks disagree still agree on ticks.

A schedule the database refuses (a ``StoreError`` other than ``StoreUnavailable``: a value its
columns cannot hold, a constraint) is that schedule's outcome, with the reason in ``error``;
the pass goes on with the others. ``StoreUnavailable`` ends the pass (the loop backs off and
tries again), and any other exception is a bug: it ends the pass too (run/scheduler.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from supervisor import schedules
from supervisor.errors import StoreError, StoreUnavailable
from supervisor.model import ScheduleAdvance, ScheduleState
from supervisor.schedules import ScheduleSpec, TickPlan

RETRIES = 3


@dataclass(frozen=True, slots=True)
class ScheduleOutcome:
    """What a pass did with one schedule: its plan (``took``: this supervisor wrote it) and
    the jobs it enqueued, (tick, job id); ``error``: why the database refused its write
    (nothing was written for it)."""

    name: str
    plan: TickPlan
    took: bool = False
    enqueued: tuple[tuple[float, int], ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PassReport:
    """A pass: the store's ``now``, each schedule's outcome, and the rows after it."""

    now: float
    outcomes: tuple[ScheduleOutcome, ...]
    states: dict[str, ScheduleState]

    @property
    def next_tick(self) -> float | None:
        """The earliest next tick of any schedule."""
        ticks = [o.plan.next_tick for o in self.outcomes if o.plan.next_tick is not None]
        return min(ticks, default=None)


def schedule_pass(
    store: Any, specs: Sequence[ScheduleSpec], since: float | None = None
) -> PassReport:
    """One pass; ``since``: the store's now at this supervisor's previous pass (``plan``)."""
    names = [s.name for s in specs]
    read = store.schedule_states(names)
    refused: dict[str, str] = {}
    missing = [n for n in names if n not in read.states]
    if missing:
        refused = _register(store, missing)
        read = store.schedule_states(names)
    outcomes = tuple(
        _refused(spec, refused[spec.name], read.now)
        if spec.name in refused
        else _isolated(store, spec, read.states[spec.name], read.now, since)
        for spec in specs
    )
    states = read.states
    if any(o.took for o in outcomes):
        states = store.schedule_states(names).states
    return PassReport(read.now, outcomes, states)


def _register(store: Any, names: list[str]) -> dict[str, str]:
    """Rows for ``names``; those the database refuses, with why (each other one is made)."""
    try:
        store.register_schedules(names)
        return {}
    except StoreUnavailable:
        raise
    except StoreError:  # refused: narrowed to its names below
        pass
    refused = {}
    for name in names:
        try:
            store.register_schedules([name])
        except StoreUnavailable:
            raise
        except StoreError as exc:
            refused[name] = str(exc)
    return refused


def _isolated(
    store: Any, spec: ScheduleSpec, state: ScheduleState, now: float, since: float | None
) -> ScheduleOutcome:
    """``_decide``, with a write the database refuses kept to this schedule's outcome."""
    try:
        return _decide(store, spec, state, now, since)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        return _refused(spec, str(exc), now)


def _refused(spec: ScheduleSpec, why: str, now: float) -> ScheduleOutcome:
    # its next tick still paces the loop: the write is tried again then (and logged only
    # when the reason changes, run/scheduler.py)
    return ScheduleOutcome(spec.name, TickPlan(next_tick=spec.timing.after(now)), error=why)


def _decide(
    store: Any, spec: ScheduleSpec, state: ScheduleState, now: float, since: float | None
) -> ScheduleOutcome:
    plan = TickPlan()
    for _ in range(RETRIES):
        _note_success(store, state)
        plan = schedules.plan(spec, state, now, since)
        if plan.through is None:
            return ScheduleOutcome(spec.name, plan)
        jobs = tuple((tick, schedules.tick_job(spec, tick)) for tick in plan.enqueue)
        advance = ScheduleAdvance(spec.name, state.through, plan.through, jobs, plan.not_enqueued)
        done = store.advance_schedule(advance)
        if done.took:
            return ScheduleOutcome(spec.name, plan, True, done.enqueued)
        fresh = store.schedule_states([spec.name])  # another supervisor decided first
        state, now = fresh.states[spec.name], fresh.now
    return ScheduleOutcome(spec.name, TickPlan(next_tick=plan.next_tick))


def _note_success(store: Any, state: ScheduleState) -> None:
    """Keep the row's last success as late as any recent tick's: a done job is pruned after
    the retention, and its tick leaves the recent ones after ``TICKS_KEPT`` more."""
    latest = state.latest_success()
    if latest is not None and latest != state.last_success_at:
        store.note_schedule_success(state.name, latest)
