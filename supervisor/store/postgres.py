"""``PostgresStore``: the engine for several hosts sharing one queue.

- Claims lock rows with ``FOR UPDATE SKIP LOCKED`` (in the shared claim statement), so
  concurrent claimers never wait on each other and never take the same job.
- The database's ``now()`` is the one clock: hosts' clocks may disagree, leases must not.
  An injected clock replaces it only in tests.
- Enqueue sends ``NOTIFY fleetd_jobs`` with the pool's name, so idle supervisors wake at once.
- Single-statement verbs run in autocommit: no BEGIN/COMMIT round trips.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Float, String, cast, create_engine, extract, func, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL
from sqlalchemy.sql.elements import ColumnElement

from supervisor.clock import Clock
from supervisor.store.sql import SqlStore
from supervisor.store.wake import PostgresWaker

NOTIFY_CHANNEL = "fleetd_jobs"
_MIGRATION_LOCK = 0x0F1EE7D  # advisory lock key: one migrator at a time


class PostgresStore(SqlStore):
    dialect = "postgresql"

    def __init__(self, url: URL, clock: Clock | None = None) -> None:
        engine = create_engine(
            url,
            pool_size=2,
            max_overflow=8,
            connect_args={"connect_timeout": 5, "application_name": "fleetd"},
        )
        super().__init__(engine, clock)
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)

    def waker(self) -> PostgresWaker:
        return PostgresWaker(self._conninfo, NOTIFY_CHANNEL)

    def _db_now(self) -> ColumnElement[float]:
        return cast(extract("epoch", func.now()), Float(precision=53))

    def _token(self) -> ColumnElement[str]:
        return func.replace(cast(func.gen_random_uuid(), String), "-", "")

    def _insert(self) -> Any:
        return pg_insert

    def _lock_for_migration(self, conn: Connection) -> None:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})

    def _after_enqueue(self, conn: Connection, pools: set[str]) -> None:
        for pool in sorted(pools):
            conn.execute(
                text("SELECT pg_notify(:channel, :pool)"), {"channel": NOTIFY_CHANNEL, "pool": pool}
            )
