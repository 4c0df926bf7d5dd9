"""Versioned migrations, applied automatically when a store is opened.

Each migration is a function of a connection and a dialect name, applied once, in order, inside
one transaction together with the version bump (DDL is transactional in SQLite and PostgreSQL),
under a lock so two supervisors starting at once do not both migrate. A database whose version is
newer than this code knows is refused rather than used: an old node must not write rows it does
not understand.

Rule for the next engineer: never edit a released migration. When the schema changes, add a new
function to ``MIGRATIONS``; ``schema.py`` then describes the latest shape, and migration 1 keeps
creating exactly the tables it named at the time. An index added later to one of those tables
is attached to it in ``schema.py`` (so migration 1 makes it on a new database) and created with
IF NOT EXISTS by its own migration (so an existing database gets it too).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Column, Connection, inspect, select, text
from sqlalchemy.schema import CreateIndex

from supervisor.errors import StoreError
from supervisor.store import schema

Migration = Callable[[Connection, str], None]


def _v1_tables(conn: Connection, dialect: str) -> None:
    """Jobs, nodes and their indexes."""
    schema.metadata.create_all(conn, tables=[schema.jobs, schema.nodes])


def _v2_postgres_vacuum(conn: Connection, dialect: str) -> None:
    """Every claim, extend and ack leaves a dead tuple behind, and the default autovacuum
    threshold (20 % of the table) lets them pile up until the claim's index scan walks through
    thousands of dead entries. Vacuum this hot table after a fixed number of changes instead, and
    leave room on each page for HOT updates (updates that touch no indexed column stay on the
    page and add no index entry)."""
    if dialect != "postgresql":
        return
    conn.execute(
        text(
            "ALTER TABLE fleetd_jobs SET ("
            " autovacuum_vacuum_scale_factor = 0.0,"
            " autovacuum_vacuum_threshold = 5000,"
            " autovacuum_vacuum_insert_scale_factor = 0.0,"
            " autovacuum_vacuum_insert_threshold = 50000,"
            " autovacuum_analyze_scale_factor = 0.02,"
            " autovacuum_vacuum_cost_delay = 0,"
            " fillfactor = 80)"
        )
    )


def _v3_caps_and_retry_budget(conn: Connection, dialect: str) -> None:
    """The capped, fair claim's indexes and the retry-budget counters. IF NOT EXISTS: on a new
    database migration 1's ``create_all`` of the jobs table already made the index, because
    ``schema.py`` attaches every index of the latest shape to the table (and reflection cannot
    see an expression index, so ``checkfirst`` would not do)."""
    for index in (schema.ix_jobs_tenant_claim, schema.ix_jobs_leased):
        conn.execute(CreateIndex(index, if_not_exists=True))
    schema.metadata.create_all(conn, tables=[schema.retry_budget])


def _v4_postgres_partial_indexes(conn: Connection, dialect: str) -> None:
    """PostgreSQL only: the index over every job row that listed by state gives way to
    partial ones, and the key gets a unique index over keyed rows (schema.py says why: each
    claim and each ack added an entry to both full indexes, ~4 µs of server CPU a job each).

    ``uq_jobs_kind_key`` stays for now: a node or client still running older code (a rolling
    deploy) names ``ON CONFLICT (kind, key)`` without the predicate, which only a full unique
    index matches, and it only checks the schema version when it opens the store. TODO (a later
    release's migration, once no node older than this one can be running): drop it."""
    if dialect != "postgresql":
        return
    conn.execute(text("DROP INDEX IF EXISTS ix_jobs_state"))
    for index in (schema.ix_jobs_queued, schema.ix_jobs_dead, schema.uq_jobs_key):
        conn.execute(CreateIndex(index, if_not_exists=True))


def _v5_schedules(conn: Connection, dialect: str) -> None:
    """The schedule rows and their recent ticks (supervisor/store/schedule_table.py). The
    rows' ``timing`` and ``timing_at`` were added to this migration rather than a sixth: no
    release had it yet, so no database outside tests was made by the first version."""
    schema.metadata.create_all(conn, tables=[schema.schedules, schema.schedule_ticks])


def _v6_operator_controls(conn: Connection, dialect: str) -> None:
    """Cancel and pause (supervisor/store/controls.py): the jobs' ``cancel_requested_at``
    column, its partial index and the cancelled jobs' index, and the pauses table. The column
    is added only where migration 1 did not already make it (``schema.py`` has the latest
    shape); a nullable column without a default is a catalog change on both engines, however
    many rows the table holds."""
    have = {c["name"] for c in inspect(conn).get_columns(schema.jobs.name)}
    if "cancel_requested_at" not in have:
        column: Column[float] = schema.jobs.c.cancel_requested_at
        kind = column.type.compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE {schema.jobs.name} ADD COLUMN {column.name} {kind}"))
    for index in (schema.ix_jobs_cancel, schema.ix_jobs_cancelled):
        conn.execute(CreateIndex(index, if_not_exists=True))
    schema.metadata.create_all(conn, tables=[schema.pauses])


def _v7_rate_buckets(conn: Connection, dialect: str) -> None:
    """The token buckets of ``rate_limit`` and ``kind_rate_limit`` (supervisor/store/rated.py).
    A new table: nothing else changes, and a node still running older code never reads it."""
    schema.metadata.create_all(conn, tables=[schema.rate_buckets])


MIGRATIONS: tuple[Migration, ...] = (
    _v1_tables,
    _v2_postgres_vacuum,
    _v3_caps_and_retry_budget,
    _v4_postgres_partial_indexes,
    _v5_schedules,
    _v6_operator_controls,
    _v7_rate_buckets,
)
LATEST = len(MIGRATIONS)


def current_version(conn: Connection) -> int:
    """The schema version recorded in the database; 0 for an empty database."""
    schema.metadata.create_all(conn, tables=[schema.schema_version])
    found = conn.execute(select(schema.schema_version.c.version)).scalars().all()
    return max(found, default=0)


def migrate(conn: Connection, dialect: str, now: float) -> int:
    """Apply every missing migration on ``conn`` (already inside a locked transaction) and
    return the version reached."""
    version = current_version(conn)
    if version > LATEST:
        raise StoreError(
            f"the database schema is version {version}, newer than this fleetd knows ({LATEST}): "
            "upgrade fleetd on this host"
        )
    for number in range(version + 1, LATEST + 1):
        MIGRATIONS[number - 1](conn, dialect)
        conn.execute(schema.schema_version.insert().values(version=number, applied_at=now))
    return LATEST
