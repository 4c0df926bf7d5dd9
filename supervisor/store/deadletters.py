"""The dead-letter queue (``DeadLetters``, a mixin of ``SqlStore``, as ``ControlTable`` is):
list, requeue and purge dead jobs.

A requeue or purge by ``ids`` checks every id first and changes nothing when one is missing
(``JobNotFound``) or not dead (``NotDead``); by filter it acts on the dead jobs the filter
matches (``ControlTable.matching``). Each statement is guarded by ``state = 'dead'``, so a job
that left the queue meanwhile is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, select, update
from sqlalchemy.sql.elements import ColumnElement

from supervisor.errors import JobNotFound, NotDead
from supervisor.model import Job, JobFilter, JobState
from supervisor.store.rows import chunks
from supervisor.store.schema import jobs

QUEUED, DEAD = JobState.QUEUED.value, JobState.DEAD.value


class DeadLetters:
    """The dead-letter verbs for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore, Reads and ControlTable

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...
        def list_jobs(
            self,
            *,
            state: JobState | None = None,
            pool: str | None = None,
            limit: int = 100,
            after_id: int = 0,
        ) -> list[Job]: ...
        def matching(self, where: JobFilter, states: Sequence[JobState]) -> ColumnElement[bool]: ...

    def dlq_list(self, *, pool: str | None = None, limit: int = 100) -> list[Job]:
        return self.list_jobs(state=JobState.DEAD, pool=pool, limit=limit)

    def dlq_requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        pool: str | None = None,
        where: JobFilter | None = None,
    ) -> list[int]:
        """Give dead jobs a fresh delivery budget. ``ids`` None means every dead job (of
        ``pool``, and matching ``where``). Naming a job that is missing or not dead changes
        nothing and raises."""
        with self._tx() as conn:
            target = self._dead_ids(conn, ids, pool, where)
            for chunk in chunks(target):
                self._exec(
                    conn,
                    update(jobs)
                    .where(jobs.c.id.in_(chunk), jobs.c.state == DEAD)
                    .values(state=QUEUED, attempts=0, available_at=self._now(), finished_at=None),
                )
        return target

    def dlq_purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        pool: str | None = None,
        where: JobFilter | None = None,
    ) -> list[int]:
        """Delete dead jobs (all of them, or of ``pool`` and matching ``where``, or exactly
        ``ids``); returns the ids deleted, in order."""
        purged: list[int] = []
        with self._tx() as conn:
            target = self._dead_ids(conn, ids, pool, where)
            for chunk in chunks(target):
                stmt = delete(jobs).where(jobs.c.id.in_(chunk), jobs.c.state == DEAD)
                purged.extend(conn.execute(stmt.returning(jobs.c.id)).scalars())
        return sorted(purged)

    def _dead_ids(
        self,
        conn: Connection,
        ids: Sequence[int] | None,
        pool: str | None,
        where: JobFilter | None = None,
    ) -> list[int]:
        if ids is None:
            cond = self.matching(where or JobFilter(), [JobState.DEAD])
            query = select(jobs.c.id).where(cond).order_by(jobs.c.id)
            if pool is not None:
                query = query.where(jobs.c.pool == pool)
            return list(self._exec(conn, query).scalars())
        wanted = sorted(set(ids))
        states: dict[int, str] = {}
        for chunk in chunks(wanted):
            query = select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(chunk))
            states.update((r.id, r.state) for r in conn.execute(query))
        missing = [i for i in wanted if i not in states]
        if missing:
            raise JobNotFound(f"no job with id {', '.join(map(str, missing))}")
        alive = [f"{i} ({states[i]})" for i in wanted if states[i] != DEAD]
        if alive:
            raise NotDead(f"not dead, so not in the dead-letter queue: job {', '.join(alive)}")
        return wanted
