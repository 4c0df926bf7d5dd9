"""Enqueue (``Enqueues``, a mixin of ``SqlStore``, as ``ControlTable`` is): new jobs in one
transaction, ids back in input order, and a keyed job's insert-or-find.

A job with an idempotency key is inserted with ``ON CONFLICT DO NOTHING`` on the partial
(kind, key) index, and read back when the key was taken: the job already there is returned
unchanged. Jobs without a key go in one ``INSERT ... RETURNING`` for the batch, their ids in
parameter order. The dialects differ only in the INSERT construct (``_insert``) and in how
supervisors waiting for work are woken (``_after_enqueue``, ``_after_commit``);
``PostgresStore.enqueue`` has a one-statement fast path for a single job without a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, insert, select, text
from sqlalchemy.sql.elements import ColumnElement

from supervisor.model import JobState, NewJob
from supervisor.store.rows import TIME, job_params
from supervisor.store.schema import KEYED, jobs

QUEUED = JobState.QUEUED.value


class Enqueues:
    """Enqueue verbs for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...
        def _with_now(self, params: dict[str, Any]) -> dict[str, Any]: ...
        def _insert(self) -> Any: ...
        def _after_enqueue(self, conn: Connection, pools: set[str]) -> None: ...
        def _after_commit(self, pools: set[str]) -> None: ...

    def enqueue(self, job: NewJob) -> int:
        """Add one job; an existing (kind, key) returns that job's id and changes nothing."""
        return self.enqueue_many([job])[0]

    def enqueue_many(self, new: Sequence[NewJob]) -> list[int]:
        """Add jobs in one transaction; ids come back in input order."""
        if not new:
            return []
        with self._tx() as conn:
            ids = self._insert_plain(conn, [j for j in new if j.key is None])
            plain = iter(ids)
            out = [next(plain) if j.key is None else self._insert_keyed(conn, j) for j in new]
            self._after_enqueue(conn, {j.pool for j in new})
        self._after_commit({j.pool for j in new})
        return out

    def _row_values(self) -> dict[str, Any]:
        now = self._now()
        names = ("kind", "pool", "payload", "tenant", "key", "priority", "max_deliveries")
        values: dict[str, Any] = {n: bindparam(n) for n in names}
        values.update(
            state=QUEUED,
            enqueued_at=now,
            available_at=now + bindparam("delay", type_=TIME),
        )
        return values

    def _insert_plain(self, conn: Connection, new: list[NewJob]) -> list[int]:
        if not new:
            return []
        rows = [self._with_now(job_params(j)) for j in new]
        return list(conn.execute(self._insert_stmt, rows).scalars())

    @cached_property
    def _insert_stmt(self) -> Any:
        stmt = insert(jobs).values(self._row_values())
        return stmt.returning(jobs.c.id, sort_by_parameter_order=True)

    @cached_property
    def _insert_keyed_stmt(self) -> Any:
        stmt = self._insert()(jobs).values(self._row_values())
        keyed = stmt.on_conflict_do_nothing(index_elements=["kind", "key"], index_where=text(KEYED))
        return keyed.returning(jobs.c.id)

    def _insert_keyed(self, conn: Connection, job: NewJob) -> int:
        return self._insert_or_find(conn, job)[0]

    def _insert_or_find(self, conn: Connection, job: NewJob) -> tuple[int, bool]:
        """The keyed job's id, and whether this inserted it (False: the key named a job that
        was there already, which is returned unchanged)."""
        inserted = self._exec(conn, self._insert_keyed_stmt, job_params(job)).scalar()
        if inserted is not None:
            return int(inserted), True
        found = select(jobs.c.id).where(jobs.c.kind == job.kind, jobs.c.key == job.key)
        return int(conn.execute(found).scalar_one()), False
