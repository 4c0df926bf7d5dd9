"""``PostgresStore``: the engine for several hosts sharing one queue.

- Claims lock rows with ``FOR UPDATE SKIP LOCKED`` (in the shared claim statement), so
  concurrent claimers never wait on each other and never take the same job.
- The database's ``now()`` is the one clock: hosts' clocks may disagree, leases must not.
  An injected clock replaces it only in tests.
- Enqueue sends ``NOTIFY fleetd_jobs`` with the pool's name, so idle supervisors wake at once;
  one job without a key is one statement, its insert and its NOTIFY together (``enqueue``).
- Single-statement verbs run in autocommit: no BEGIN/COMMIT round trips.
- Claims of a pool with fleet-wide caps are serialised by an advisory lock on the pool.
- The reaper also vacuums the job table when dead row versions pile up (``vacuum_if_due``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    String,
    bindparam,
    cast,
    create_engine,
    event,
    extract,
    func,
    insert,
    literal,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL
from sqlalchemy.sql.elements import ColumnElement

from supervisor.clock import Clock, SystemClock
from supervisor.errors import StoreError
from supervisor.model import Ack, Lease, NewJob, ReapOutcome
from supervisor.store.finals import (
    ENDER_TRY,
    FINAL_CHANNEL,
    PAYLOAD_IDS,
    PostgresFinalWatch,
    final_payload,
)
from supervisor.store.rows import job_params
from supervisor.store.schema import jobs
from supervisor.store.sql import SqlStore
from supervisor.store.wake import PostgresWaker

NOTIFY_CHANNEL = "fleetd_jobs"
_DB_NOW = "CAST(extract(epoch FROM now()) AS DOUBLE PRECISION)"
_MIGRATION_LOCK = 0x0F1EE7D  # advisory lock key: one migrator at a time
_CLAIM_LOCKS = 0x0F1EE7C  # advisory lock space (first of two keys): capped claims per pool
# libpq: a connect gives up after 5 s; a peer that vanished (a partition, a dead host) is
# noticed by TCP keepalives after ~25 s idle, and unacknowledged data fails after 30 s
CONNECTION_BOUNDS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
STATEMENT_TIMEOUT = "30s"
LOCK_TIMEOUT = "10s"
VACUUM_DEAD_ROWS = 10_000  # dead row versions in fleetd_jobs that make a vacuum due (~5,000 jobs)
VACUUM_MIN_INTERVAL = 5.0  # seconds between two checks by one store
# ANALYZE fleetd_jobs when the planner believes in fewer than a quarter of the queued jobs
# there are, and at least this many are queued (counted up to QUEUED_COUNTED)
ANALYZE_QUEUED = 1_000
QUEUED_COUNTED = 10_000

log = logging.getLogger(__name__)


class PostgresStore(SqlStore):
    dialect = "postgresql"

    def __init__(self, url: URL, clock: Clock | None = None, *, bounded: bool = False) -> None:
        engine = create_engine(
            url,
            pool_size=2,
            max_overflow=8,
            connect_args={"application_name": "fleetd", **CONNECTION_BOUNDS},
        )
        event.listen(engine, "connect", _on_connect)
        if bounded:
            event.listen(engine, "connect", _bound_statements)
        super().__init__(engine, clock)
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._monotonic = (clock or SystemClock()).monotonic
        self._next_vacuum_check = 0.0
        self._next_analyze_check = 0.0

    def waker(self) -> PostgresWaker:
        return PostgresWaker(self._conninfo, NOTIFY_CHANNEL, CONNECTION_BOUNDS)

    def _finals_in_tx(self, conn: Connection, ids: Sequence[int]) -> None:
        if ids:
            conn.execute(
                text(
                    f"SELECT CASE WHEN {ENDER_TRY} THEN false "
                    "ELSE pg_notify(:channel, :ids) IS NULL END"
                ),
                {"channel": FINAL_CHANNEL, "ids": final_payload(ids)},
            )

    def final_watch(self, within: float = math.inf) -> PostgresFinalWatch | None:
        """LISTEN on a connection of its own (one kept between waits; a second wait at the
        same time, from another thread, opens another); None (the waiter polls) when it
        cannot connect, or cannot have the waiters' lock within ``within`` s (at most
        ``finals.LOCK_WAIT``)."""
        import psycopg

        try:
            conn = self._listeners.pop()
        except IndexError:
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True, **CONNECTION_BOUNDS)
            except psycopg.Error:
                return None
        try:
            return PostgresFinalWatch(conn, self._keep_listener, within)
        except psycopg.Error:
            if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.close()
            else:  # the lock was not had in time: the connection is as good as before
                self._keep_listener(conn)
            return None

    @cached_property
    def _listeners(self) -> list[Any]:
        return []

    def _keep_listener(self, conn: Any) -> None:
        if self._listeners:
            conn.close()
        else:
            self._listeners.append(conn)

    def close(self) -> None:
        while self.__dict__.get("_listeners"):
            self._listeners.pop().close()
        super().close()

    def enqueue(self, job: NewJob) -> int:
        """One job without a key is one statement in autocommit: the insert and its NOTIFY
        together, one round trip that commits itself, where a transaction takes three (the
        insert with its BEGIN, the NOTIFY, the COMMIT). All of it is pickup latency (the
        job's ``enqueued_at`` is its transaction's start): on an idle fleet, 2.8 -> 1.9 ms
        p50 (docs/benchmarks.md). A keyed job takes the shared path (its conflict check)."""
        if job.key is not None:
            return super().enqueue(job)
        with self._auto() as conn:
            return int(self._exec(conn, self._enqueue_one_stmt, job_params(job)).scalar_one())

    @cached_property
    def _enqueue_one_stmt(self) -> Any:
        inserted = (
            insert(jobs).values(self._row_values()).returning(jobs.c.id, jobs.c.pool).cte("new")
        )
        notify = func.pg_notify(literal(NOTIFY_CHANNEL), inserted.c.pool)
        return select(inserted.c.id, notify)

    def ack(self, acks: Sequence[Ack]) -> list[Lease]:
        """One statement for the whole batch (arrays unnested into rows), in autocommit: one
        round trip and one commit, where the shared version needs a locking read first. The
        RETURNING list says exactly which (id, token) pairs took. Its waiters are told in the
        same statement: one NOTIFY for the batch, and only while somebody waits
        (supervisor/store/finals.py: the waiters' lock), evaluated once, when the first row
        is returned, so never for a batch that took nothing."""
        if not acks:
            return []
        params = {
            "ids": [a.lease.job_id for a in acks],
            "tokens": [a.lease.token for a in acks],
            "results": [a.result for a in acks],
            "peaks": [a.peak_rss for a in acks],
            "durations": [a.duration for a in acks],
        }
        with self._auto() as conn:
            rows = self._exec(conn, self._ack_batch_stmt, params)
            took = {Lease(r.id, r.lease_token) for r in rows}
        return [a.lease for a in acks if a.lease not in took]

    @cached_property
    def _ack_batch_stmt(self) -> Any:
        now = "CAST(:now AS DOUBLE PRECISION)" if self._clock is not None else _DB_NOW
        return text(
            f"""
            WITH acked AS (
            UPDATE fleetd_jobs AS j
               SET state = CASE WHEN j.cancel_requested_at IS NULL THEN 'done'
                                ELSE 'cancelled' END,
                   result = v.result, peak_rss = v.peak_rss,
                   duration = v.duration, finished_at = {now},
                   owner = NULL, locked_until = NULL
              FROM unnest(CAST(:ids AS BIGINT[]), CAST(:tokens AS TEXT[]),
                          CAST(:results AS TEXT[]), CAST(:peaks AS BIGINT[]),
                          CAST(:durations AS DOUBLE PRECISION[]))
                   AS v(id, token, result, peak_rss, duration)
             WHERE j.id = v.id AND j.lease_token = v.token AND j.state = 'leased'
            RETURNING j.id, j.lease_token
            )
            SELECT id, lease_token,
                   (SELECT CASE WHEN {ENDER_TRY} THEN false
                           ELSE pg_notify('{FINAL_CHANNEL}',
                                          CASE WHEN count(*) <= {PAYLOAD_IDS}
                                               THEN string_agg(CAST(id AS TEXT), ',')
                                               ELSE '*' END) IS NULL END
                      FROM acked) AS told
              FROM acked
            """
        )

    def _db_now(self) -> ColumnElement[float]:
        return cast(extract("epoch", func.now()), Float(precision=53))

    def _token(self) -> ColumnElement[str]:
        return func.replace(cast(func.gen_random_uuid(), String), "-", "")

    def _insert(self) -> Any:
        return pg_insert

    def _lock_for_migration(self, conn: Connection) -> None:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})

    def _lock_claims(self, conn: Connection, pool: str) -> None:
        """Capped claims of one pool take turns, on every host, until each commits: the
        counts a claim reads stay true until it has leased. The two-key form keeps these
        locks apart from the migration lock; pools whose names hash alike share a lock,
        which only costs them a wait. Pools without caps never take it."""
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:space, hashtext(:pool))"),
            {"space": _CLAIM_LOCKS, "pool": pool},
        )

    def _after_enqueue(self, conn: Connection, pools: set[str]) -> None:
        for pool in sorted(pools):
            conn.execute(
                text("SELECT pg_notify(:channel, :pool)"), {"channel": NOTIFY_CHANNEL, "pool": pool}
            )

    def _announce(self, pools: set[str]) -> None:
        try:
            with self._auto() as conn:
                self._after_enqueue(conn, pools)
        except StoreError as exc:  # the release itself stands; polling picks the jobs up
            log.warning("could not announce released jobs: %s", exc)

    def reap(self, *, limit: int = 1000) -> ReapOutcome:
        """Expired leases back to queued or dead (``SqlStore.reap``), then the job table's
        vacuum and statistics if they are due. A failed vacuum or analyze is logged; the reap
        it followed stands."""
        outcome = super().reap(limit=limit)
        for upkeep, what in ((self.vacuum_if_due, "vacuum"), (self.analyze_if_due, "analyze")):
            try:
                upkeep()
            except StoreError as exc:
                log.warning("%s of fleetd_jobs failed: %s", what, exc)
        return outcome

    def analyze_if_due(self) -> bool:
        """ANALYZE fleetd_jobs when the planner's idea of the queued jobs is far below what is
        queued, checking at most every ``VACUUM_MIN_INTERVAL`` seconds; True when it ran.

        The claim's plan rests on that idea. A table never analyzed, or last analyzed when
        nothing was queued, estimates one queued row; with 40,000 then queued, the planner
        took the smaller ix_jobs_queued (or ix_jobs_ready_age), read all of them and sorted
        them for every claim: 21 ms a claim of 120 where ix_jobs_claim takes 1 ms, and a
        drain 6x slower (docs/benchmarks.md). Autovacuum's analyze fixes it at its next
        round, up to a minute (``autovacuum_naptime``) after a burst; this check runs with
        the reaper, on the first reap after a start and every few seconds after."""
        now = self._monotonic()
        if now < self._next_analyze_check:
            return False
        self._next_analyze_check = now + VACUUM_MIN_INTERVAL
        with self._auto() as conn:
            queued = conn.execute(self._queued_counted, {"n": QUEUED_COUNTED}).scalar_one()
            if queued < ANALYZE_QUEUED:
                return False
            plan = conn.execute(_QUEUED_PLAN).scalar_one()
            if isinstance(plan, str):
                plan = json.loads(plan)
            if plan[0]["Plan"]["Plan Rows"] * 4 >= queued:
                return False
            conn.execute(text("ANALYZE fleetd_jobs"))
        return True

    @cached_property
    def _queued_counted(self) -> Any:
        some = select(literal(1)).where(jobs.c.state == "queued").limit(bindparam("n"))
        return select(func.count()).select_from(some.subquery())

    def vacuum_if_due(self) -> bool:
        """VACUUM fleetd_jobs when it holds ``VACUUM_DEAD_ROWS`` dead row versions, checking at
        most every ``VACUUM_MIN_INTERVAL`` seconds; True when it ran.

        Each claim leaves the claimed row's old entry in ix_jobs_claim, at the front of the range
        every later claim walks, until a vacuum removes it: after 60,000 claims with no vacuum a
        claim read 367 index pages instead of 4 (docs/benchmarks.md). Autovacuum (tuned for this
        table by migration 2) wakes at most once per ``autovacuum_naptime``, a minute by default,
        and may be off; the reaper runs every few seconds on every node. SKIP_LOCKED: a node
        whose neighbour is vacuuming skips. INDEX_CLEANUP ON: never leave the index entries
        behind, however few heap pages changed."""
        now = self._monotonic()
        if now < self._next_vacuum_check:
            return False
        self._next_vacuum_check = now + VACUUM_MIN_INTERVAL
        with self._auto() as conn:
            dead = conn.execute(text("SELECT pg_stat_get_dead_tuples('fleetd_jobs'::regclass)"))
            if dead.scalar_one() < VACUUM_DEAD_ROWS:
                return False
            conn.execute(text("VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) fleetd_jobs"))
        return True


# the planner's estimate of the queued rows (what every claim's plan starts from)
_QUEUED_PLAN = text("EXPLAIN (FORMAT JSON) SELECT 1 FROM fleetd_jobs WHERE state = 'queued'")


def _bound_statements(dbapi_conn: Any, _record: Any) -> None:
    """The supervisor's connections (its store process): no statement runs longer than
    ``STATEMENT_TIMEOUT`` and none waits longer than ``LOCK_TIMEOUT`` for a lock; either
    fails as StoreUnavailable and is retried with backoff. (Clients are not bounded: a big
    ``enqueue_many`` may take longer, and nothing waits on it but its caller.)"""
    with dbapi_conn.cursor() as cursor:
        cursor.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    dbapi_conn.commit()


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    """Plan every statement for its own parameters. psycopg prepares a statement after five
    executions, and PostgreSQL may then switch to a generic plan; for the claim, on a job table
    whose statistics are missing or stale (a fresh table, a bulk import, autovacuum off or not
    yet around), the generic plan took 15-20 ms where the custom one takes 1 ms, with 20,000
    jobs queued (docs/benchmarks.md). Planning it each time costs ~0.1 ms."""
    with dbapi_conn.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_custom_plan")
    dbapi_conn.commit()
