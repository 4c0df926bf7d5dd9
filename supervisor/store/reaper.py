"""The verbs every node runs on a timer (``Reaper``, a mixin of ``SqlStore``, as
``ControlTable`` is): the reaper, which takes back expired leases, and retention, which
deletes old finished jobs.

Both are meant to run on every node at once. The reaper's pick skips rows another reaper has
locked (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's single writer serialises them), so
reapers on several nodes share the expired leases instead of waiting on each other. ``prune``
deletes in batches, each its own statement, so no transaction holds the write lock for long.
``PostgresStore.reap`` adds the job table's vacuum and analyze when they are due.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Integer,
    String,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from supervisor.model import ErrorKind, JobState, ReapOutcome
from supervisor.store.rows import CANCEL_ASKED
from supervisor.store.schema import jobs

QUEUED, LEASED, DONE, DEAD, CANCELLED = (s.value for s in JobState)


class Reaper:
    """Reap and prune for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _auto(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...
        def _finals_in_tx(self, conn: Connection, ids: Sequence[int]) -> None: ...
        def _finals_committed(self, ids: Sequence[int]) -> None: ...

    def reap(self, *, limit: int = 1000) -> ReapOutcome:
        """Expired leases back to queued, or dead when the delivery limit is reached (recorded
        as ``lease_expired``). Safe to run on every node at once."""
        with self._tx() as conn:  # a transaction: the wake-up of jobs it ended goes in it
            rows = self._exec(conn, self._reap_stmt, {"limit": limit}).all()
            ended = [r.id for r in rows if r.state in (DEAD, CANCELLED)]
            self._finals_in_tx(conn, ended)
        self._finals_committed(ended)
        requeued = tuple(sorted(r.id for r in rows if r.state == QUEUED))
        dead = tuple(sorted(r.id for r in rows if r.state == DEAD))
        cancelled = tuple(sorted(r.id for r in rows if r.state == CANCELLED))
        return ReapOutcome(requeued, dead, {r.id: r.attempts for r in rows}, cancelled)

    @cached_property
    def _reap_stmt(self) -> Any:
        now = self._now()
        expired = (
            select(jobs.c.id)
            .where(jobs.c.state == LEASED, jobs.c.locked_until < now)
            .limit(bindparam("limit", type_=Integer))
            .with_for_update(skip_locked=True)
        )
        at_limit = jobs.c.attempts >= jobs.c.max_deliveries
        message = (
            literal("the lease held by node ", String)
            + func.coalesce(jobs.c.owner, "?")
            + literal(" expired during attempt ", String)
            + cast(jobs.c.attempts, String)
        )
        return (
            update(jobs)
            .where(jobs.c.id.in_(expired.scalar_subquery()))
            .values(
                state=case((CANCEL_ASKED, CANCELLED), (at_limit, DEAD), else_=QUEUED),
                finished_at=case((CANCEL_ASKED | at_limit, now), else_=None),
                available_at=now,
                error_kind=ErrorKind.LEASE_EXPIRED.value,
                last_error=message,
                owner=None,
                locked_until=None,
            )
            .returning(jobs.c.id, jobs.c.state, jobs.c.attempts)
        )

    def prune(self, *, older_than: float, batch: int = 5000) -> int:
        """Delete done and cancelled jobs that finished more than ``older_than`` seconds ago,
        in batches so no transaction holds the write lock for long (each state through its
        own partial index)."""
        total = 0
        for state in (DONE, CANCELLED):
            while True:
                cutoff = self._now() - older_than
                old = (
                    select(jobs.c.id)
                    .where(jobs.c.state == state, jobs.c.finished_at < cutoff)
                    .limit(batch)
                )
                with self._auto() as conn:
                    removed = self._exec(
                        conn, delete(jobs).where(jobs.c.id.in_(old.scalar_subquery()))
                    )
                total += removed.rowcount
                if removed.rowcount < batch:
                    break
        return total
