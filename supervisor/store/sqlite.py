"""``SqliteStore``: the embedded default, one file shared by every process on the host.

WAL lets readers (``fleetd status``, clients) work while one writer writes; ``busy_timeout``
makes a writer wait for the lock instead of failing. Python's sqlite3 module would otherwise
open transactions on its own schedule, so it is switched to autocommit and fleetd issues
``BEGIN IMMEDIATE`` itself for multi-statement verbs: the write lock is taken at the start, so a
transaction never fails half-way on a lock upgrade. Single-statement verbs run in autocommit, as
one implicit transaction each.

Time is the injected clock (the system clock by default): every process on one host shares it.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from sqlalchemy import Boolean, Connection, create_engine, event, func
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.sql.elements import ColumnElement

from supervisor.clock import Clock, SystemClock
from supervisor.errors import StoreError
from supervisor.store import driver
from supervisor.store.finals import FinalAnnouncer, LocalFinalWatch, local_supervisor_present
from supervisor.store.sql import SqlStore
from supervisor.store.wake import LocalWaker, wake_local

BUSY_TIMEOUT_MS = 30_000
_AUTOCOMMIT = "fleetd_autocommit"


class SqliteStore(SqlStore):
    dialect = "sqlite"
    _guard_in_limit = True  # a fair pool's guard (SqlStore._claim_stmt)

    def __init__(self, url: URL, clock: Clock | None = None, *, create: bool = True) -> None:
        database = url.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise StoreError(f"{url}: an in-memory SQLite database cannot be shared; use a file")
        folder = Path(database).parent
        if not folder.is_dir():
            raise StoreError(f"cannot open {url}: folder {str(folder)!r} does not exist")
        # a file: URI (uri=true) names its path in URI syntax: SQLite itself resolves it
        if not create and not database.startswith("file:") and not Path(database).exists():
            raise StoreError(
                f"no database at {database!r} yet "
                "(fleetd start or fleetd enqueue creates it; is the path right?)"
            )
        self.path = database
        engine = create_engine(url, pool_size=2, max_overflow=8)
        event.listen(engine, "connect", _on_connect)
        event.listen(engine, "begin", _on_begin)
        super().__init__(engine, clock or SystemClock())

    @contextmanager
    def _auto(self) -> Iterator[Connection]:
        with driver.translated(), self.engine.connect() as conn:
            yield conn.execution_options(**{_AUTOCOMMIT: True})

    def _after_commit(self, pools: set[str]) -> None:
        wake_local(self.path, pools)

    def _announce(self, pools: set[str]) -> None:
        wake_local(self.path, pools)

    def waker(self) -> LocalWaker:
        return LocalWaker(self.path)

    def _finals_committed(self, ids: Sequence[int]) -> None:
        if ids:
            self._announcer.announce(ids)

    @cached_property
    def _announcer(self) -> FinalAnnouncer:
        return FinalAnnouncer(self.path)

    def final_watch(self, within: float = math.inf) -> LocalFinalWatch | None:
        """A waiter's socket, or None (it polls) when no supervisor of this user runs on the
        file here (nobody would announce) or the socket cannot be made."""
        if not local_supervisor_present(self.path):
            return None
        try:
            return LocalFinalWatch(self.path)
        except OSError:
            return None

    def close(self) -> None:
        if "_announcer" in self.__dict__:
            self._announcer.close()
            del self.__dict__["_announcer"]
        super().close()

    def _db_now(self) -> ColumnElement[float]:  # pragma: no cover - SQLite always has a clock
        raise AssertionError("SQLite uses the injected clock")

    def _token(self) -> ColumnElement[str]:
        return func.lower(func.hex(func.randomblob(16)))

    def _insert(self) -> Any:
        return sqlite_insert

    def _mostly_true(self, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        """``likely(condition)``. Without statistics SQLite's planner takes a range on
        ``available_at`` for selective and claims through ix_jobs_ready_age, sorting every
        ready row (42 ms a claim at 100,000 queued, growing linearly). Most queued jobs are
        ready, and saying so makes it walk ix_jobs_claim, already in claim order, and stop
        after n rows."""
        return func.likely(condition, type_=Boolean)


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # fleetd issues BEGIN itself (see module docstring)
    cursor = dbapi_conn.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")  # durable across process crashes in WAL mode
    cursor.close()


def _on_begin(conn: Connection) -> None:
    """BEGIN IMMEDIATE, on the driver's own connection: through SQLAlchemy's execute it was
    a third of an empty transaction's ~40 µs (its events, a result for nothing), paid by
    every ack. Its error leaves as SQLAlchemy's own execute would raise it (for
    ``driver.translated``: a lock not had within the busy timeout is StoreUnavailable)."""
    if conn.get_execution_options().get(_AUTOCOMMIT):
        return
    try:
        conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
    except sqlite3.Error as exc:
        raise sa_exc.DBAPIError.instance("BEGIN IMMEDIATE", None, exc, sqlite3.Error) from exc
