"""What the store is asked without changing anything (``Reads``, a mixin of ``SqlStore``, as
``ControlTable`` is): a job, a page of jobs, a pool's figures (``stats``), its recent
completions (``history``) and the arrivals since an id (``arrivals``).

Each read is one autocommit statement or a few, and each is shaped for an index: the counts of
``stats`` walk the partial index of their state and stop at ``STATS_CAP``, ``history`` reads
the done jobs by finish time, ``arrivals`` reads only ids above the last one seen.
"""

from __future__ import annotations

from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, and_, func, literal, select
from sqlalchemy.sql.elements import ColumnElement

from supervisor.model import STATS_CAP, Job, JobState, PoolHistory, PoolStats
from supervisor.store.rows import as_job
from supervisor.store.schema import jobs

QUEUED, LEASED, DONE, DEAD, CANCELLED = (s.value for s in JobState)


class Reads:
    """The read-only verbs for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore

        def _auto(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...

    def get(self, job_id: int) -> Job | None:
        with self._auto() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        return None if row is None else as_job(row)

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        pool: str | None = None,
        limit: int = 100,
        after_id: int = 0,
    ) -> list[Job]:
        """Jobs by id, optionally of one state and pool, starting after ``after_id``."""
        query = select(jobs).where(jobs.c.id > after_id).order_by(jobs.c.id).limit(limit)
        if state is not None:
            query = query.where(jobs.c.state == str(state))
        if pool is not None:
            query = query.where(jobs.c.pool == pool)
        with self._auto() as conn:
            return [as_job(r) for r in conn.execute(query)]

    def stats(self, pools: Collection[str]) -> dict[str, PoolStats]:
        """Per-pool figures. Each count walks only the partial index of its state, and the
        oldest-ready query reads one index entry."""
        now = self._now()
        with self._auto() as conn:
            return {p: self._pool_stats(conn, p, now) for p in pools}

    def _pool_stats(self, conn: Connection, pool: str, now: ColumnElement[float]) -> PoolStats:
        in_pool = jobs.c.pool == pool
        queued = and_(in_pool, jobs.c.state == QUEUED)
        oldest, now_value = self._exec(
            conn, select(func.min(jobs.c.available_at), now).where(queued)
        ).one()
        ready = 0
        if oldest is not None and oldest <= now_value:
            ready = self._capped(conn, and_(queued, jobs.c.available_at <= now))
        counts = {
            state: self._capped(conn, and_(in_pool, jobs.c.state == state))
            for state in (QUEUED, LEASED, DONE, DEAD, CANCELLED)
        }
        return PoolStats(
            pool=pool,
            ready=ready,
            scheduled=max(0, counts[QUEUED] - ready),
            leased=counts[LEASED],
            done=counts[DONE],
            dead=counts[DEAD],
            cancelled=counts[CANCELLED],
            oldest_ready_age=max(0.0, now_value - oldest) if ready else 0.0,
            capped=max(ready, *counts.values()) >= STATS_CAP,
        )

    def _capped(self, conn: Connection, where: ColumnElement[bool]) -> int:
        """count(*) of the rows matching ``where``, stopping at STATS_CAP: each walks at
        most that many entries of the index its state's condition fits."""
        inner = select(literal(1)).where(where).limit(STATS_CAP).subquery()
        return int(self._exec(conn, select(func.count()).select_from(inner)).scalar_one())

    def history(self, pool: str, *, window: float, sample: int = 500) -> PoolHistory:
        """Jobs of ``pool`` done in the last ``window`` seconds (the done-jobs index by
        finish time): their count, and durations and peaks of the latest ``sample``."""
        since = self._now() - window
        recent = and_(jobs.c.pool == pool, jobs.c.state == DONE, jobs.c.finished_at >= since)
        latest = (
            select(jobs.c.duration, jobs.c.peak_rss)
            .where(recent)
            .order_by(jobs.c.finished_at.desc())
            .limit(sample)
        )
        with self._auto() as conn:
            count = self._exec(conn, select(func.count()).where(recent)).scalar_one()
            rows = self._exec(conn, latest).all()
        return PoolHistory(
            completed=count,
            durations=tuple(r.duration for r in rows if r.duration is not None),
            peaks=tuple(r.peak_rss for r in rows if r.peak_rss is not None),
        )

    def arrivals(self, *, after_id: int | None) -> tuple[dict[str, int], int]:
        """Jobs enqueued after job ``after_id``, per pool, and the highest id now (ids only
        grow and are never reused, so this reads only the new rows, by primary key). With
        ``after_id`` None only the highest id is read: counting starts now. On PostgreSQL a
        row whose transaction commits after a higher id was read is not counted (a slight
        undercount under concurrent enqueues; fine for a rate)."""
        top = select(func.coalesce(func.max(jobs.c.id), 0))
        with self._auto() as conn:
            if after_id is None:
                return {}, int(self._exec(conn, top).scalar_one())
            rows = self._exec(
                conn,
                select(jobs.c.pool, func.count(), func.max(jobs.c.id))
                .where(jobs.c.id > after_id)
                .group_by(jobs.c.pool),
            ).all()
        counts = {pool: int(n) for pool, n, _ in rows}
        return counts, max([after_id, *(int(m) for _, _, m in rows)])
