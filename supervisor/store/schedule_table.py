"""The schedule table's verbs (``ScheduleTable``, a mixin of ``SqlStore``, as ``CappedClaims``
is): read the rows, register a schedule seen for the first time, and advance a schedule in
one guarded transaction.

Why two supervisors racing produce one job: ``advance_schedule`` first moves the row's
``through`` with a compare-and-set (``WHERE name = :name AND through = :expected``) and
enqueues only when that took. The update locks the row until commit (PostgreSQL; SQLite's
``BEGIN IMMEDIATE`` serialises every writer anyway), so a second supervisor's update waits,
then finds ``through`` moved and changes nothing; it reads the row again and plans from there.
Each tick's job also carries the idempotency key ``schedule:<name>:<tick>``: were a tick ever
enqueued twice, the second insert would return the first job. The enqueue and the row's
update commit together, so a crash between them cannot lose a tick or repeat one.

A changed timing (``retime_schedule``): the row takes the new one, and ``through`` moves to
now, as for a schedule seen for the first time, by a compare-and-set on the timing seen; the
advance's compare-and-set includes the timing too, so a supervisor that planned by the old
timing enqueues nothing once the row has the new one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, case, delete, select, update
from sqlalchemy.sql.elements import ColumnElement

from supervisor.model import (
    AdvanceOutcome,
    JobState,
    NewJob,
    ScheduleAdvance,
    ScheduleRead,
    ScheduleState,
    TickJob,
)
from supervisor.store.schema import TICKS_KEPT, jobs, schedule_ticks, schedules


class ScheduleTable:
    """Schedule verbs for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _auto(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...
        def _insert(self) -> Any: ...
        def _insert_or_find(self, conn: Connection, job: NewJob) -> tuple[int, bool]: ...
        def _after_enqueue(self, conn: Connection, pools: set[str]) -> None: ...
        def _after_commit(self, pools: set[str]) -> None: ...

    def schedule_states(self, names: Collection[str] | None = None) -> ScheduleRead:
        """The rows of ``names`` (every row when None) with their recent ticks, and the
        store's now. A name without a row is left out (``register_schedules`` makes it)."""
        rows_q = select(schedules).order_by(schedules.c.name)
        ticks_q = (
            select(
                schedule_ticks.c.schedule,
                schedule_ticks.c.tick,
                schedule_ticks.c.job_id,
                jobs.c.state,
                jobs.c.finished_at,
            )
            .join_from(schedule_ticks, jobs, jobs.c.id == schedule_ticks.c.job_id, isouter=True)
            .order_by(schedule_ticks.c.schedule, schedule_ticks.c.tick)
        )
        if names is not None:
            rows_q = rows_q.where(schedules.c.name.in_(list(names)))
            ticks_q = ticks_q.where(schedule_ticks.c.schedule.in_(list(names)))
        with self._auto() as conn:
            now = float(self._exec(conn, select(self._now())).scalar_one())
            rows = conn.execute(rows_q).all()
            ticks = conn.execute(ticks_q).all()
        recent: dict[str, list[TickJob]] = {}
        for t in ticks:
            state = JobState(t.state) if t.state is not None else None
            recent.setdefault(t.schedule, []).append(
                TickJob(float(t.tick), int(t.job_id), state, t.finished_at)
            )
        states = {
            r.name: ScheduleState(
                name=r.name,
                created_at=float(r.created_at),
                through=float(r.through),
                timing=r.timing,
                timing_at=float(r.timing_at),
                last_tick=r.last_tick,
                last_job_id=r.last_job_id,
                missed=int(r.missed),
                last_success_at=r.last_success_at,
                recent=tuple(recent.get(r.name, ())),
            )
            for r in rows
        }
        return ScheduleRead(now, states)

    def register_schedules(self, timings: Mapping[str, str]) -> None:
        """Rows for schedules seen for the first time (name -> timing fingerprint), starting
        now (nothing before now is due: a new schedule is not backfilled). An existing row is
        left as it is.

        In name order: on PostgreSQL an insert waits on a row another transaction inserted
        with the same key until that one ends, so two supervisors whose configs list the same
        new schedules in different orders would each hold one and wait on the other (a
        deadlock, one of them rolled back). In one order, the second waits holding nothing."""
        if not timings:
            return
        with self._tx() as conn:
            for name in sorted(timings):
                self._exec(conn, self._register_stmt, {"s_name": name, "s_timing": timings[name]})

    @cached_property
    def _register_stmt(self) -> Any:
        now = self._now()
        stmt = self._insert()(schedules).values(
            name=bindparam("s_name"),
            created_at=now,
            through=now,
            timing=bindparam("s_timing"),
            timing_at=now,
            updated_at=now,
        )
        return stmt.on_conflict_do_nothing(index_elements=["name"])

    def retime_schedule(self, name: str, expected: str, timing: str) -> bool:
        """The schedule's timing changed from ``expected`` to ``timing``: the row takes it
        and starts afresh now (``through`` = max(through, now): no tick of the new timing
        before now is due), unless another supervisor changed the timing first (False)."""
        with self._tx() as conn:
            params = {"s_name": name, "s_expected": expected, "s_timing": timing}
            return bool(self._exec(conn, self._retime_stmt, params).rowcount)

    @cached_property
    def _retime_stmt(self) -> Any:
        now = self._now()
        return (
            update(schedules)
            .where(
                schedules.c.name == bindparam("s_name"),
                schedules.c.timing == bindparam("s_expected"),
            )
            .values(
                timing=bindparam("s_timing"),
                timing_at=now,
                through=case((schedules.c.through < now, now), else_=schedules.c.through),
                updated_at=now,
            )
        )

    def advance_schedule(self, advance: ScheduleAdvance) -> AdvanceOutcome:
        """Decide a schedule's ticks up to ``advance.through`` and enqueue its jobs, in one
        transaction, only if the row still says ``advance.expected`` (module docstring)."""
        enqueued: list[tuple[float, int]] = []
        adopted: list[float] = []  # ticks whose key named a job there already
        pools = {job.pool for _, job in advance.jobs}
        with self._tx() as conn:
            moved = self._exec(
                conn,
                self._advance_stmt,
                {
                    "s_name": advance.name,
                    "s_expected": advance.expected,
                    "s_through": advance.through,
                    "s_missed": advance.missed,
                    "s_timing": advance.timing,
                },
            )
            if moved.rowcount != 1:
                return AdvanceOutcome(took=False)
            for tick, job in advance.jobs:
                job_id, inserted = self._insert_or_find(conn, job)
                enqueued.append((tick, job_id))
                if not inserted:
                    adopted.append(tick)
            if enqueued:
                self._record_ticks(conn, advance.name, enqueued)
                self._after_enqueue(conn, pools)
        if enqueued:
            self._after_commit(pools)
        return AdvanceOutcome(took=True, enqueued=tuple(enqueued), adopted=tuple(adopted))

    @cached_property
    def _advance_stmt(self) -> Any:
        return (
            update(schedules)
            .where(
                schedules.c.name == bindparam("s_name"),
                schedules.c.through == bindparam("s_expected"),
                schedules.c.timing == bindparam("s_timing"),
            )
            .values(
                through=bindparam("s_through"),
                missed=schedules.c.missed + bindparam("s_missed"),
                updated_at=self._now(),
            )
        )

    def _record_ticks(self, conn: Connection, name: str, enqueued: list[tuple[float, int]]) -> None:
        """The ticks just enqueued become the row's last and join its recent ticks (the
        oldest beyond ``TICKS_KEPT`` are deleted)."""
        insert = self._insert()(schedule_ticks)
        conn.execute(
            insert.on_conflict_do_nothing(index_elements=["schedule", "tick"]),
            [{"schedule": name, "tick": tick, "job_id": job_id} for tick, job_id in enqueued],
        )
        last_tick, last_job = enqueued[-1]
        conn.execute(
            update(schedules)
            .where(schedules.c.name == name)
            .values(last_tick=last_tick, last_job_id=last_job)
        )
        oldest_kept = (
            select(schedule_ticks.c.tick)
            .where(schedule_ticks.c.schedule == name)
            .order_by(schedule_ticks.c.tick.desc())
            .offset(TICKS_KEPT - 1)
            .limit(1)
            .scalar_subquery()
        )
        conn.execute(
            delete(schedule_ticks).where(
                schedule_ticks.c.schedule == name, schedule_ticks.c.tick < oldest_kept
            )
        )

    def note_schedule_success(self, name: str, at: float) -> bool:
        """Record that a tick's job finished done at ``at``, unless a later success is
        recorded already; whether it changed the row."""
        stmt = (
            update(schedules)
            .where(
                schedules.c.name == name,
                (schedules.c.last_success_at.is_(None)) | (schedules.c.last_success_at < at),
            )
            .values(last_success_at=at)
        )
        with self._auto() as conn:
            return bool(conn.execute(stmt).rowcount)
