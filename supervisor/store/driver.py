"""The store's edge with the database driver: where its errors are translated, and the fast path
that hands statements to the driver's own cursor.

``translated`` is the one place where driver errors become ``StoreUnavailable``,
``StoreRejected`` or ``StoreError`` (raised ``from`` the driver's error); every verb of
``SqlStore`` runs inside it, so nothing above the store sees a SQLAlchemy or driver exception.

``Raw``, ``executemany`` and ``fetchall`` bypass SQLAlchemy's execute for the two statements
whose per-call cost dominated a short job (the uncapped claim and the ack): the statement is
compiled once and its parameters go to the driver as they are. That is only right for
statements whose parameters and columns need no type processing, and it skips SQLAlchemy's
execute events. ``driver_cursor`` keeps what SQLAlchemy's execute would have done on a lost
connection, so ``translated`` sees the same errors either way.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc

from supervisor.errors import StoreError, StoreRejected, StoreUnavailable


@contextmanager
def translated() -> Iterator[None]:
    """Translate driver errors exactly once, here."""
    try:
        yield
    except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
        raise StoreUnavailable(f"database unavailable: {one_line(exc)}") from exc
    except sa_exc.DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailable(f"database connection lost: {one_line(exc)}") from exc
        if isinstance(exc, sa_exc.DataError | sa_exc.IntegrityError):
            raise StoreRejected(f"database refused the write: {one_line(exc)}") from exc
        raise StoreError(f"database error: {one_line(exc)}") from exc
    except (UnicodeError, OverflowError) as exc:
        # a value the driver cannot encode: a lone surrogate, or an integer past 64 bits for
        # sqlite3 (raised as it is, not as a driver error); the same write fails again
        raise StoreRejected(f"database driver refused a value: {one_line(exc)}") from exc


def one_line(exc: BaseException) -> str:
    """A driver's message without its SQL echo and background links."""
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split("\n")[0].split()) or type(orig).__name__


@dataclass(frozen=True)
class Raw:
    """A statement compiled once for a dialect, for ``executemany`` and ``fetchall``."""

    sql: str
    names: tuple[str, ...] | None  # parameter order for a positional paramstyle, else None
    constants: dict[str, Any]  # the statement's own bound values (``state = 'done'``)

    @classmethod
    def of(cls, stmt: Any, dialect: Any) -> Raw:
        compiled = stmt.compile(dialect=dialect)
        names = tuple(compiled.positiontup) if compiled.positional else None
        constants = dict(compiled.construct_params(_check=False))
        return cls(compiled.string, names, constants)

    def rows(self, rows: list[dict[str, Any]]) -> list[Any]:
        """Each row's parameters as the driver takes them: the statement's own values filled
        in, in order for a positional paramstyle."""
        constants = self.constants
        if self.names is None:
            return [{**constants, **row} for row in rows]
        order = self._order
        return [order({**constants, **row}) for row in rows]

    @cached_property
    def _order(self) -> Any:
        names = self.names or ()
        if len(names) > 1:
            return operator.itemgetter(*names)  # a C call per row, not a generator
        return lambda row: tuple(row[name] for name in names)


def executemany(conn: Connection, raw: Raw, rows: list[dict[str, Any]]) -> int:
    """Run ``raw`` once per row on the driver's own cursor, in ``conn``'s transaction; the rows
    changed. SQLAlchemy would build each row's parameters in Python (~10 µs a row, most of a
    short job's ack); this hands them to the driver as they are, so it is only for statements
    whose parameters need no type processing."""
    with driver_cursor(conn, raw) as cursor:
        cursor.executemany(raw.sql, raw.rows(rows))
        return cursor.rowcount


def fetchall(conn: Connection, raw: Raw, params: dict[str, Any]) -> list[Any]:
    """Run ``raw`` with ``params`` on the driver's own cursor: its rows as the driver returns
    them (tuples). For statements whose parameters and columns need no type processing, as
    ``executemany``."""
    with driver_cursor(conn, raw) as cursor:
        cursor.execute(raw.sql, raw.rows([params])[0])
        return cursor.fetchall()


@contextmanager
def driver_cursor(conn: Connection, raw: Raw) -> Iterator[Any]:
    """A driver cursor on ``conn``'s connection; its errors leave as SQLAlchemy would raise
    them, for ``translated``. A lost connection (the server restarted) is handled as
    SQLAlchemy's own execute handles it: that connection is invalidated (handed back as it
    is, its reset would fail and the pool would log a traceback) and so is every other one in
    the pool, which the same restart has cut too."""
    dialect = conn.dialect
    dbapi_error = dialect.loaded_dbapi.Error
    dbapi_conn = conn.connection.dbapi_connection
    cursor = None
    try:
        cursor = dbapi_conn.cursor()  # type: ignore[union-attr]
        yield cursor
    except dbapi_error as exc:
        lost = dialect.is_disconnect(exc, dbapi_conn, cursor)
        if lost:
            conn.invalidate(exc)
            conn.engine.dispose()  # the pooled connections: fresh ones on the next call
        raise sa_exc.DBAPIError.instance(
            raw.sql, None, exc, dbapi_error, connection_invalidated=lost
        ) from exc
    finally:
        if cursor is not None:
            with contextlib.suppress(dbapi_error):
                cursor.close()
