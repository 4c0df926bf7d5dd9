"""Migration 4 on a database left by the previous release, on SQLite and PostgreSQL. On
PostgreSQL the index over every row that listed by state gives way to partial ones and the key
gets a partial unique index; the full key index stays, for nodes still running older code.
SQLite keeps its shape. Nothing a user relies on changes: the idempotency key (also as an older
node writes it), listing and counting by state."""

from __future__ import annotations

import json

from sqlalchemy import create_engine, inspect, text

from supervisor.model import Ack, JobState, NewJob
from supervisor.store import migrations, open_store, schema

POSTGRES_ONLY = {"ix_jobs_queued", "ix_jobs_dead", "uq_jobs_key"}
# an older node's keyed insert: the conflict target without the predicate (release 3's SQL)
OLDER_NODES_INSERT = (
    "INSERT INTO fleetd_jobs (kind, pool, state, payload, key, max_deliveries, enqueued_at,"
    " available_at) VALUES ('render', 'bulk', 'queued', '{}', :key, 3, 0, 0)"
    " ON CONFLICT (kind, key) DO NOTHING RETURNING id"
)


def job(key: str | None = None, kind: str = "render") -> NewJob:
    return NewJob(kind=kind, pool="bulk", payload=json.dumps({}), max_deliveries=3, key=key)


def index_names(store) -> set[str]:
    with store.engine.connect() as conn:
        query = (
            "SELECT name FROM sqlite_master WHERE type = 'index'"
            if conn.dialect.name == "sqlite"
            else "SELECT indexname FROM pg_indexes"
            " WHERE tablename = 'fleetd_jobs' AND schemaname = current_schema()"
        )
        return {row[0] for row in conn.execute(text(query))}


def make_version_3_database(db_url: str) -> None:
    """The schema as release 3 left it (migrations 1-3, its indexes), with a keyed and a
    keyless job."""
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            dialect = engine.dialect.name
            schema.metadata.create_all(conn, tables=[schema.schema_version])
            for number, migration in enumerate(migrations.MIGRATIONS[:3], start=1):
                migration(conn, dialect)
                conn.execute(schema.schema_version.insert().values(version=number, applied_at=0))
            if dialect == "postgresql":  # migration 1 makes today's shape: back to release 3's
                for name in POSTGRES_ONLY:
                    conn.execute(text(f"DROP INDEX {name}"))
                conn.execute(text("CREATE INDEX ix_jobs_state ON fleetd_jobs (state, pool, id)"))
                conn.execute(
                    text("CREATE UNIQUE INDEX uq_jobs_kind_key ON fleetd_jobs (kind, key)")
                )
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


def test_migration_4_upgrades_a_version_3_database(db_url, clock):
    make_version_3_database(db_url)
    store = open_store(db_url, clock)
    try:
        indexes = index_names(store)
        assert "uq_jobs_kind_key" in indexes  # older nodes' keyed inserts need it, both engines
        if store.engine.dialect.name == "postgresql":
            assert indexes >= POSTGRES_ONLY and "ix_jobs_state" not in indexes
        else:
            assert "ix_jobs_state" in indexes and not POSTGRES_ONLY & indexes
        # the key written before the migration still dedupes; keyless jobs never collide
        old = store.list_jobs(state=JobState.QUEUED, pool="bulk")
        keyed = next(j.id for j in old if j.key == "doc-1")
        assert store.enqueue(job(key="doc-1")) == keyed
        assert store.enqueue(job(key="doc-1", kind="thumb")) != keyed
        a, b = store.enqueue(job()), store.enqueue(job())
        assert a != b
        # a node still running release 3's code: its keyed insert works and dedupes too
        with store.engine.begin() as conn:
            assert conn.execute(text(OLDER_NODES_INSERT), {"key": "doc-1"}).all() == []
            assert len(conn.execute(text(OLDER_NODES_INSERT), {"key": "doc-2"}).all()) == 1
        assert store.enqueue(job(key="doc-2")) != keyed
        # listing and counting by state
        claimed = store.claim(pool="bulk", kinds={"render"}, n=2, node="n", lease=30.0)
        store.ack([Ack(claimed[0].lease)])
        stats = store.stats(["bulk"])["bulk"]
        assert (stats.ready, stats.leased, stats.done) == (4, 1, 1)  # 6 enqueued, 2 claimed
        assert [j.id for j in store.list_jobs(state=JobState.DONE)] == [claimed[0].job_id]
        assert [j.id for j in store.list_jobs(state=JobState.LEASED, pool="bulk")] == [
            claimed[1].job_id
        ]
    finally:
        store.close()


def test_a_new_database_is_made_in_its_engines_latest_shape(db_url, clock):
    store = open_store(db_url, clock)
    try:
        indexes = index_names(store)
        if store.engine.dialect.name == "postgresql":
            assert indexes >= POSTGRES_ONLY
            assert not {"ix_jobs_state", "uq_jobs_kind_key"} & indexes
        else:
            assert {"ix_jobs_state", "uq_jobs_kind_key"} <= indexes
            assert not POSTGRES_ONLY & indexes
        keyed = store.enqueue(job(key="k"))
        assert store.enqueue(job(key="k")) == keyed
    finally:
        store.close()
    reopened = open_store(db_url, clock)  # nothing left to migrate: opens as it is
    reopened.close()


def test_migration_6_adds_cancel_and_pauses_to_a_version_5_database(db_url, clock):
    """Release 5's jobs table has no cancel_requested_at column, its indexes or the pauses
    table: migration 6 adds them, and a job leased before the upgrade can be cancelled."""
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            dialect = engine.dialect.name
            schema.metadata.create_all(conn, tables=[schema.schema_version])
            for number, migration in enumerate(migrations.MIGRATIONS[:5], start=1):
                migration(conn, dialect)
                conn.execute(schema.schema_version.insert().values(version=number, applied_at=0))
            for index in ("ix_jobs_cancel", "ix_jobs_cancelled"):  # migration 1 is today's shape
                conn.execute(text(f"DROP INDEX {index}"))
            conn.execute(text("ALTER TABLE fleetd_jobs DROP COLUMN cancel_requested_at"))
            conn.execute(
                text(
                    "INSERT INTO fleetd_jobs (kind, pool, state, payload, max_deliveries,"
                    " enqueued_at, available_at, owner, lease_token, locked_until, attempts)"
                    " VALUES ('render', 'bulk', 'leased', '{}', 3, 0, 0, 'n', 'tok', 1e12, 1)"
                )
            )
    finally:
        engine.dispose()
    store = open_store(db_url, clock)
    try:
        assert {"ix_jobs_cancel", "ix_jobs_cancelled"} <= index_names(store)
        (old,) = store.list_jobs()
        assert store.cancel([old.id]).requested == {old.id: "n"}
        assert [c.job_id for c in store.controls("n").cancels] == [old.id]
        assert store.pause("bulk") and [p.pool for p in store.pauses()] == ["bulk"]
        assert migrations.LATEST >= 6
    finally:
        store.close()


def test_migration_7_adds_the_rate_buckets_to_a_version_6_database(db_url, clock):
    """Release 6 has no fleetd_rate_buckets: migration 7 makes it, and a rate-limited claim
    then spends from it on a database whose jobs were queued before the upgrade."""
    from supervisor.rates import Bucket, RateLimit
    from supervisor.store.claim import ClaimRequest

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            dialect = engine.dialect.name
            schema.metadata.create_all(conn, tables=[schema.schema_version])
            for number, migration in enumerate(migrations.MIGRATIONS[:6], start=1):
                migration(conn, dialect)
                conn.execute(schema.schema_version.insert().values(version=number, applied_at=0))
            assert not inspect(conn).has_table("fleetd_rate_buckets")
            conn.execute(
                text(
                    "INSERT INTO fleetd_jobs (kind, pool, state, payload, max_deliveries,"
                    " enqueued_at, available_at, attempts)"
                    " VALUES ('render', 'bulk', 'queued', '{}', 3, 0, 0, 0)"
                )
            )
    finally:
        engine.dispose()
    store = open_store(db_url, clock)
    try:
        assert migrations.LATEST == 7
        request = ClaimRequest("bulk", {"render"}, 5, "n", 30)
        got = store.claim_rated(request, RateLimit(Bucket(2, 2)))
        assert len(got.rows) == 1
        assert store.rate_levels("bulk")[""][0] == 1.0
    finally:
        store.close()
