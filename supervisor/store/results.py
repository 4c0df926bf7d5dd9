"""A delivery's results (``LeaseWrites``, a mixin of ``SqlStore``, as ``ControlTable`` is): extend
the lease, ack, fail and release.

Each write is guarded by state and lease token in its WHERE clause (``LEASES_MATCH``, or the
ack's id and token) and reports which rows it changed: a late result from a worker whose lease
was taken over changes nothing and comes back as lost. A job whose cancel was requested while
it was leased ends ``cancelled`` whichever of these ends the delivery (controls.py). Jobs made
final here are told to their waiters in the same transaction (``_finals_in_tx``, finals.py).
``PostgresStore.ack`` replaces the shared ack with one batch statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Connection, Engine, bindparam, case, literal, select, update
from sqlalchemy.sql.elements import ColumnElement

from supervisor.clock import Clock
from supervisor.model import Ack, FailOutcome, Failure, JobState, Lease
from supervisor.store import driver
from supervisor.store.budget import Budgets
from supervisor.store.rows import CANCEL_ASKED, LEASES_MATCH, TIME, chunks, lease_pairs
from supervisor.store.schema import jobs

QUEUED, LEASED, DONE, DEAD, CANCELLED = (s.value for s in JobState)

# Which of the given leases are still valid, their rows locked (``LeaseWrites._owned``)
_OWNED_STMT = (
    select(jobs.c.id, jobs.c.lease_token)
    .where(jobs.c.state == LEASED, LEASES_MATCH)
    .with_for_update()
)


class _Partial(Exception):
    """Inside the store only: a batched write did not take for every row; roll it back."""


class LeaseWrites:
    """Extend, ack, fail and release for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore
        engine: Engine
        _clock: Clock | None
        _budgets: Budgets

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _auto(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...
        def _announce(self, pools: set[str]) -> None: ...
        def _finals_in_tx(self, conn: Connection, ids: Sequence[int]) -> None: ...
        def _finals_committed(self, ids: Sequence[int]) -> None: ...

    def extend(self, leases: Sequence[Lease], *, lease: float) -> list[Lease]:
        """Push the leases' expiry to now + ``lease`` (a statement per ``BATCH``); return the
        leases NOT extended (lost: taken over, reaped or finished) so their workers can be
        killed."""
        if not leases:
            return []
        kept: set[Lease] = set()
        with self._auto() as conn:  # a statement a chunk: a host holds thousands at most
            for part in chunks(leases):
                params = {"leases": lease_pairs(part), "lease": lease}
                kept.update(
                    Lease(r.id, r.lease_token) for r in self._exec(conn, self._extend_stmt, params)
                )
        return [lease_ for lease_ in leases if lease_ not in kept]

    @cached_property
    def _extend_stmt(self) -> Any:
        return (
            update(jobs)
            .where(jobs.c.state == LEASED, LEASES_MATCH)
            .values(
                locked_until=self._now() + bindparam("lease", type_=TIME),
                extensions=jobs.c.extensions + 1,
            )
            .returning(jobs.c.id, jobs.c.lease_token)
        )

    def ack(self, acks: Sequence[Ack]) -> list[Lease]:
        """Mark jobs done with their results; return the leases that were no longer ours
        (nothing changed for those). Each row's update is guarded by its lease, so one
        executemany usually does it; only when fewer rows changed than acks were given is it
        rolled back and redone knowing which leases are still ours."""
        if not acks:
            return []
        now = self._clock.now() if self._clock is not None else None
        params = [
            {
                "b_id": a.lease.job_id,
                "b_token": a.lease.token,
                "b_result": a.result,
                "b_peak_rss": a.peak_rss,
                "b_duration": a.duration,
                "now": now,
            }
            for a in acks
        ]
        ids = [a.lease.job_id for a in acks]
        try:
            with self._tx() as conn:
                changed = driver.executemany(conn, self._ack_raw, params)
                if changed != len(acks) or not conn.dialect.supports_sane_multi_rowcount:
                    raise _Partial  # roll back, and redo it row by row below
                self._finals_in_tx(conn, ids)
            self._finals_committed(ids)
            return []
        except _Partial:
            pass
        with self._tx() as conn:
            owned = self._owned(conn, [a.lease for a in acks])
            mine = [p for p, a in zip(params, acks, strict=True) if a.lease in owned]
            if mine:
                conn.execute(self._ack_stmt, mine)
                self._finals_in_tx(conn, [p["b_id"] for p in mine])
        self._finals_committed([p["b_id"] for p in mine])
        return [a.lease for a in acks if a.lease not in owned]

    def _owned(self, conn: Connection, leases: Sequence[Lease]) -> set[Lease]:
        """Those of ``leases`` still valid (job leased under that token), their rows locked for
        this transaction (SQLite's write lock is already held; PostgreSQL locks the rows)."""
        owned: set[Lease] = set()
        for part in chunks(leases):
            rows = conn.execute(_OWNED_STMT, {"leases": lease_pairs(part)})
            owned.update(Lease(r.id, r.lease_token) for r in rows)
        return owned

    @cached_property
    def _ack_raw(self) -> driver.Raw:
        return driver.Raw.of(self._ack_stmt, self.engine.dialect)

    @cached_property
    def _ack_stmt(self) -> Any:
        return (
            update(jobs)
            .where(
                jobs.c.id == bindparam("b_id"),
                jobs.c.lease_token == bindparam("b_token"),
                jobs.c.state == LEASED,
            )
            .values(
                state=case((CANCEL_ASKED, CANCELLED), else_=DONE),
                result=bindparam("b_result"),
                peak_rss=bindparam("b_peak_rss"),
                duration=bindparam("b_duration"),
                finished_at=self._now(),
                owner=None,
                locked_until=None,
            )
        )

    def fail(self, failures: Sequence[Failure]) -> FailOutcome:
        """Record failed deliveries: retry after ``retry_delay`` while attempts remain,
        otherwise (or when ``retry_delay`` is None) dead-letter. A failure with a retry
        ``budget`` that is spent is deferred instead (supervisor/store/budget.py)."""
        retried: list[int] = []
        dead: list[int] = []
        cancelled: list[int] = []
        lost: list[Lease] = []
        with self._tx() as conn:
            deferred = self._budgets.judge(conn, failures)
            for f in failures:
                stmt = self._dead_stmt if f.retry_delay is None else self._retry_stmt
                deferral = deferred.get(f.lease.job_id)
                params = {
                    "leases": [(f.lease.job_id, f.lease.token)],
                    "f_delay": deferral.delay if deferral else f.retry_delay or 0.0,
                    "f_error_kind": None if f.error_kind is None else str(f.error_kind),
                    "f_message": deferral.message if deferral else f.message,
                    "f_peak_rss": f.peak_rss,
                    "f_duration": f.duration,
                }
                row = self._exec(conn, stmt, params).first()
                if row is None:
                    lost.append(f.lease)
                else:
                    ended = {DEAD: dead, CANCELLED: cancelled}.get(row.state, retried)
                    ended.append(row.id)
            self._finals_in_tx(conn, dead + cancelled)
        self._finals_committed(dead + cancelled)
        later = tuple(i for i in retried if i in deferred)
        return FailOutcome(tuple(retried), tuple(dead), tuple(lost), later, tuple(cancelled))

    @cached_property
    def _retry_stmt(self) -> Any:
        return self._fail_statement(jobs.c.attempts >= jobs.c.max_deliveries)

    @cached_property
    def _dead_stmt(self) -> Any:
        return self._fail_statement(literal(True))

    def _fail_statement(self, at_limit: ColumnElement[bool]) -> Any:
        now = self._now()
        return (
            update(jobs)
            .where(jobs.c.state == LEASED, LEASES_MATCH)
            .values(
                state=case((CANCEL_ASKED, CANCELLED), (at_limit, DEAD), else_=QUEUED),
                available_at=case(
                    (CANCEL_ASKED | at_limit, jobs.c.available_at),
                    else_=now + bindparam("f_delay", type_=TIME),
                ),
                finished_at=case((CANCEL_ASKED | at_limit, now), else_=None),
                error_kind=bindparam("f_error_kind"),
                last_error=bindparam("f_message"),
                peak_rss=bindparam("f_peak_rss", type_=BigInteger),
                duration=bindparam("f_duration", type_=TIME),
                owner=None,
                locked_until=None,
            )
            .returning(jobs.c.id, jobs.c.state)
        )

    def release(self, leases: Sequence[Lease]) -> list[int]:
        """Hand jobs back untouched: visible at once, this delivery not counted. Returns the
        ids released (a lease no longer ours is skipped)."""
        if not leases:
            return []
        with self._tx() as conn:  # a transaction: a cancelled job's wake-up goes in it
            rows = [
                row
                for part in chunks(leases)
                for row in self._exec(conn, self._release_stmt, {"leases": lease_pairs(part)})
            ]
            ended = [r.id for r in rows if r.state == CANCELLED]
            self._finals_in_tx(conn, ended)
        self._finals_committed(ended)
        if any(r.state == QUEUED for r in rows):  # idle supervisors take them at once
            self._announce({r.pool for r in rows if r.state == QUEUED})
        return sorted(r.id for r in rows)

    @cached_property
    def _release_stmt(self) -> Any:
        return (
            update(jobs)
            .where(jobs.c.state == LEASED, LEASES_MATCH)
            .values(
                state=case((CANCEL_ASKED, CANCELLED), else_=QUEUED),
                attempts=jobs.c.attempts - 1,
                available_at=self._now(),
                finished_at=case((CANCEL_ASKED, self._now()), else_=None),
                owner=None,
                locked_until=None,
                lease_token=None,
            )
            .returning(jobs.c.id, jobs.c.pool, jobs.c.state)
        )
