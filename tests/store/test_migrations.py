"""Migration 4 on a database left by the previous release, on SQLite and PostgreSQL: the two
indexes over every job row give way to partial ones, and nothing a user relies on changes
(the idempotency key, listing and counting by state)."""

from __future__ import annotations

import json

from sqlalchemy import create_engine, text

from supervisor.model import Ack, JobState, NewJob
from supervisor.store import migrations, open_store, schema


def job(key: str | None = None, kind: str = "render") -> NewJob:
    return NewJob(kind=kind, pool="bulk", payload=json.dumps({}), max_deliveries=3, key=key)


def index_names(conn) -> set[str]:
    query = (
        "SELECT name FROM sqlite_master WHERE type = 'index'"
        if conn.dialect.name == "sqlite"
        else "SELECT indexname FROM pg_indexes"
        " WHERE tablename = 'fleetd_jobs' AND schemaname = current_schema()"
    )
    return {row[0] for row in conn.execute(text(query))}


def assert_latest_indexes(store) -> None:
    with store.engine.connect() as conn:
        indexes = index_names(conn)
    assert {"ix_jobs_queued", "ix_jobs_dead", "uq_jobs_key"} <= indexes
    assert not {"ix_jobs_state", "uq_jobs_kind_key"} & indexes


def make_version_3_database(db_url: str) -> None:
    """The schema as release 3 left it: migrations 1-3, with the two full indexes it had."""
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            dialect = engine.dialect.name
            schema.metadata.create_all(conn, tables=[schema.schema_version])
            for number, migration in enumerate(migrations.MIGRATIONS[:3], start=1):
                migration(conn, dialect)
                conn.execute(schema.schema_version.insert().values(version=number, applied_at=0))
            for name in ("ix_jobs_queued", "ix_jobs_dead", "uq_jobs_key"):
                conn.execute(text(f"DROP INDEX {name}"))  # migration 1 makes today's shape
            conn.execute(text("CREATE INDEX ix_jobs_state ON fleetd_jobs (state, pool, id)"))
            conn.execute(text("CREATE UNIQUE INDEX uq_jobs_kind_key ON fleetd_jobs (kind, key)"))
            conn.execute(
                text(
                    "INSERT INTO fleetd_jobs (kind, pool, state, payload, key, max_deliveries,"
                    " enqueued_at, available_at) VALUES"
                    " ('render', 'bulk', 'queued', '{}', 'doc-1', 3, 0, 0),"
                    " ('render', 'bulk', 'queued', '{}', NULL, 3, 0, 0)"
                )
            )
    finally:
        engine.dispose()


def test_migration_4_replaces_the_indexes_over_every_row(db_url, clock):
    make_version_3_database(db_url)
    store = open_store(db_url, clock)
    try:
        assert_latest_indexes(store)
        # the key written before the migration still dedupes; keyless jobs never collide
        old = store.list_jobs(state=JobState.QUEUED, pool="bulk")
        keyed = next(j.id for j in old if j.key == "doc-1")
        assert store.enqueue(job(key="doc-1")) == keyed
        assert store.enqueue(job(key="doc-1", kind="thumb")) != keyed
        a, b = store.enqueue(job()), store.enqueue(job())
        assert a != b
        # listing and counting by state, each state through its own index now
        claimed = store.claim(pool="bulk", kinds={"render"}, n=2, node="n", lease=30.0)
        store.ack([Ack(claimed[0].lease)])
        stats = store.stats(["bulk"])["bulk"]
        assert (stats.ready, stats.leased, stats.done) == (3, 1, 1)  # 5 enqueued, 2 claimed
        assert [j.id for j in store.list_jobs(state=JobState.DONE)] == [claimed[0].job_id]
        assert [j.id for j in store.list_jobs(state=JobState.LEASED, pool="bulk")] == [
            claimed[1].job_id
        ]
    finally:
        store.close()


def test_a_new_database_is_made_in_the_latest_shape_once(db_url, clock):
    store = open_store(db_url, clock)
    try:
        assert_latest_indexes(store)
    finally:
        store.close()
    reopened = open_store(db_url, clock)  # nothing left to migrate: opens as it is
    reopened.close()
