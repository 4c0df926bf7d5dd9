"""Operator controls in the store (``ControlTable``, a mixin of ``SqlStore``, as
``ScheduleTable`` is): cancel, pause and resume, the filters of bulk actions, and what every
supervisor reads several times a second (``controls``).

Cancel is one guarded statement per batch of rows, so it races safely with claims, results
and the reaper on every engine::

    UPDATE fleetd_jobs SET state = CASE state WHEN 'queued' THEN 'cancelled' ELSE state END,
                           cancel_requested_at = CASE state WHEN 'leased' THEN now ... END, ...
     WHERE <ids or filter> AND state IN ('queued', 'leased')
    RETURNING id, state, owner

A queued job (waiting, or between retries) is cancelled at once. A leased one only gets
``cancel_requested_at``: the supervisor holding its lease sees it (``controls``) and stops the
worker, and whatever then ends that delivery (the kill's write, a result that was already on
its way, a release at the end of a drain, the reaper after a lost host) makes the job
``cancelled``: the verbs that end a delivery test the column first (store/results.py, reaper.py).
So a cancelled job never goes back to the queue, whichever host or path ends it. Both engines
evaluate the CASE on the row version the WHERE matched (PostgreSQL re-checks a row another
transaction changed meanwhile), so a job that moved from leased to queued under a cancel is
cancelled, not left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from supervisor.errors import JobNotFound
from supervisor.model import CancelOutcome, ControlState, Job, JobFilter, JobState, Lease, Pause
from supervisor.store.rows import as_job, chunks
from supervisor.store.schema import ALL_KINDS, jobs, pauses

# literals, not bound parameters: SQLite uses a partial index only for a query whose WHERE
# names the index's own constants
_QUEUED = literal_column("'queued'")
_LEASED = literal_column("'leased'")
_CANCELLED = literal_column("'cancelled'")
CANCEL_BATCH = 5000  # rows per statement of a cancel by filter


class ControlTable:
    """Cancel, pause and the bulk filters for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _auto(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...
        def _insert(self) -> Any: ...
        def _announce_controls(self) -> None: ...
        def _finals_in_tx(self, conn: Connection, ids: Sequence[int]) -> None: ...
        def _finals_committed(self, ids: Sequence[int]) -> None: ...

    # ---- cancel -------------------------------------------------------------------------

    def cancel(
        self, ids: Sequence[int] | None = None, *, where: JobFilter | None = None
    ) -> CancelOutcome:
        """Cancel jobs: exactly ``ids`` (a missing one raises ``JobNotFound`` and changes
        nothing), or every queued or leased job ``where`` matches (its ``states`` narrow it).
        Queued jobs become cancelled at once; leased ones get their cancel requested;
        final ones are reported unchanged."""
        if ids is None and where is None:
            raise ValueError("cancel needs ids or a filter")
        cancelled: list[int] = []
        requested: dict[int, str | None] = {}
        unchanged: dict[int, JobState] = {}
        with self._tx() as conn:
            if ids is not None:
                wanted = sorted(set(ids))
                states = self._states(conn, wanted)
                missing = [i for i in wanted if i not in states]
                if missing:
                    raise JobNotFound(f"no job with id {', '.join(map(str, missing))}")
                for chunk in chunks(wanted):
                    self._cancel_rows(conn, jobs.c.id.in_(chunk), cancelled, requested)
                touched = {*cancelled, *requested}
                # read again: a job seen live above that the update did not take ended
                # meanwhile (PostgreSQL re-checks the update's guard against the new row)
                after = self._states(conn, [i for i in wanted if i not in touched])
                unchanged = {i: JobState(s) for i, s in after.items()}
            else:
                assert where is not None
                cancellable = self.cancellable(where)
                if cancellable is not None:
                    chosen = (
                        select(jobs.c.id).where(cancellable).order_by(jobs.c.id).limit(CANCEL_BATCH)
                    )
                    while self._cancel_rows(
                        conn, jobs.c.id.in_(chosen.scalar_subquery()), cancelled, requested
                    ):
                        pass
            self._finals_in_tx(conn, cancelled)
        self._finals_committed(cancelled)
        if requested:
            self._announce_controls()  # the supervisors holding them look at once
        return CancelOutcome(tuple(sorted(cancelled)), requested, unchanged)

    def cancellable(self, where: JobFilter) -> ColumnElement[bool] | None:
        """What a cancel by ``where`` would touch: its queued and leased jobs, less the leased
        ones asked to stop already (the cancel's loop would choose them forever, and a dry run
        would count them again). None when ``where``'s states leave no live job."""
        live = _live_states(where)
        if not live:
            return None
        fresh = (jobs.c.state == _QUEUED) | jobs.c.cancel_requested_at.is_(None)
        return and_(self.matching(where, live), fresh)

    def _cancel_rows(
        self,
        conn: Connection,
        which: ColumnElement[bool],
        cancelled: list[int],
        requested: dict[int, str | None],
    ) -> int:
        """One guarded statement (the module's docstring); returns the rows it changed."""
        now = self._now()
        stmt = (
            update(jobs)
            .where(which, jobs.c.state.in_([_QUEUED, _LEASED]))
            .values(
                state=case((jobs.c.state == _QUEUED, _CANCELLED), else_=jobs.c.state),
                finished_at=case((jobs.c.state == _QUEUED, now), else_=jobs.c.finished_at),
                cancel_requested_at=case(
                    (jobs.c.state == _LEASED, func.coalesce(jobs.c.cancel_requested_at, now)),
                    else_=jobs.c.cancel_requested_at,
                ),
            )
            .returning(jobs.c.id, jobs.c.state, jobs.c.owner)
        )
        rows = self._exec(conn, stmt).all()
        for row in rows:
            if row.state == JobState.CANCELLED:
                cancelled.append(row.id)
            else:
                requested[row.id] = row.owner
        return len(rows)

    def _states(self, conn: Connection, ids: Sequence[int]) -> dict[int, str]:
        states: dict[int, str] = {}
        for chunk in chunks(ids):
            query = select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(chunk))
            states.update((r.id, r.state) for r in conn.execute(query))
        return states

    # ---- filters --------------------------------------------------------------------------

    def matching(self, where: JobFilter, states: Sequence[JobState]) -> ColumnElement[bool]:
        """The filter as SQL, over ``states``. ``since`` counts back from the store's now
        (bound at execution, as every "now"), on the finish time of final jobs and the
        enqueue time of the others."""
        terms: list[ColumnElement[bool]] = [jobs.c.state.in_([str(s) for s in states])]
        for column, value in (
            (jobs.c.kind, where.kind),
            (jobs.c.tenant, where.tenant),
            (jobs.c.pool, where.pool),
            (jobs.c.error_kind, None if where.error_kind is None else str(where.error_kind)),
        ):
            if value is not None:
                terms.append(column == value)
        if where.since is not None:
            final = all(s in (JobState.DONE, JobState.DEAD, JobState.CANCELLED) for s in states)
            column = jobs.c.finished_at if final else jobs.c.enqueued_at
            terms.append(column >= self._now() - bindparam("since", where.since))
        return and_(*terms)

    def find_jobs(
        self, where: JobFilter, states: Sequence[JobState], *, limit: int = 100
    ) -> tuple[int, list[Job]]:
        """How many jobs the filter matches over ``states``, and the first ``limit`` by id:
        what a bulk action would touch (its dry run)."""
        return self._found(self.matching(where, states), limit)

    def find_cancellable(self, where: JobFilter, *, limit: int = 100) -> tuple[int, list[Job]]:
        """``find_jobs`` for a cancel by ``where``: exactly what it would touch."""
        cond = self.cancellable(where)
        return (0, []) if cond is None else self._found(cond, limit)

    def _found(self, cond: ColumnElement[bool], limit: int) -> tuple[int, list[Job]]:
        with self._auto() as conn:
            count = self._exec(conn, select(func.count()).where(cond)).scalar_one()
            rows = self._exec(conn, select(jobs).where(cond).order_by(jobs.c.id).limit(limit))
            return int(count), [as_job(r) for r in rows]

    # ---- pause ----------------------------------------------------------------------------

    def pause(self, pool: str, kind: str | None = None) -> bool:
        """Pause a pool (``kind`` None) or one kind of it, fleet-wide. False when it was
        paused already (nothing changed)."""
        stmt = (
            self._insert()(pauses)
            .values(pool=pool, kind=kind or ALL_KINDS, paused_at=self._now())
            .on_conflict_do_nothing(index_elements=["pool", "kind"])
            .returning(pauses.c.pool)
        )
        with self._auto() as conn:
            took = self._exec(conn, stmt).first() is not None
        if took:
            self._announce_controls()
        return took

    def resume(
        self, pool: str, kind: str | None = None, *, pool_wide_only: bool = False
    ) -> list[Pause]:
        """Lift the pauses of a pool: every one of it (``kind`` None), or that kind's only;
        with ``pool_wide_only``, the pause of the whole pool alone (its kinds paused one by
        one stay paused: the live view's ``p`` lifts only what its ``p`` set). Returns the
        pauses lifted (none: nothing was paused)."""
        stmt = delete(pauses).where(pauses.c.pool == pool)
        if pool_wide_only:
            stmt = stmt.where(pauses.c.kind == ALL_KINDS)
        elif kind is not None:
            stmt = stmt.where(pauses.c.kind == kind)
        stmt = stmt.returning(pauses.c.pool, pauses.c.kind, pauses.c.paused_at)
        with self._auto() as conn:
            lifted = [_pause(r) for r in conn.execute(stmt)]
        if lifted:
            self._announce_controls()
        return sorted(lifted, key=lambda p: (p.pool, p.kind or ""))

    def pauses(self) -> list[Pause]:
        """Every pause in force, by pool and kind."""
        with self._auto() as conn:
            return [_pause(r) for r in conn.execute(self._pauses_stmt)]

    @cached_property
    def _pauses_stmt(self) -> Any:
        return select(pauses).order_by(pauses.c.pool, pauses.c.kind)

    # ---- what a supervisor reads --------------------------------------------------------

    def controls(self, node: str) -> ControlState:
        """The pauses in force and the leases ``node`` holds whose cancel was requested (a
        partial index of those: usually empty, read in microseconds)."""
        with self._auto() as conn:
            found = [_pause(r) for r in conn.execute(self._pauses_stmt)]
            rows = conn.execute(self._cancels_stmt, {"node": node}).all()
        return ControlState(tuple(found), tuple(Lease(r.id, r.lease_token) for r in rows))

    @cached_property
    def _cancels_stmt(self) -> Any:
        return select(jobs.c.id, jobs.c.lease_token).where(
            jobs.c.state == _LEASED,
            jobs.c.cancel_requested_at.is_not(None),
            jobs.c.owner == bindparam("node"),
        )


def _live_states(where: JobFilter) -> list[JobState]:
    """The states a cancel by filter may touch: queued and leased, or those of them asked."""
    live = (JobState.QUEUED, JobState.LEASED)
    return [s for s in (where.states or live) if s in live]


def _pause(row: Any) -> Pause:
    return Pause(row.pool, row.kind or None, row.paused_at)
