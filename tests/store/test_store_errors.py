"""Driver errors reach callers as the store's own errors, whatever path the statement took
(the ack's executemany goes to the driver's cursor directly)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import event

from supervisor.errors import StoreUnavailable
from supervisor.model import Ack, NewJob
from supervisor.store import open_store
from tests.support.databases import database_url, postgres_base_url


def test_a_full_disk_during_an_ack_is_store_unavailable(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/q.db")
    store.enqueue_many([NewJob("k", "p", "{}", 3) for _ in range(4)])
    claimed = store.claim(pool="p", kinds=["k"], n=4, node="n", lease=60.0)

    def full(dbapi_conn, _record) -> None:  # the file may not grow: "database or disk is full"
        pages = dbapi_conn.execute("PRAGMA page_count").fetchone()[0]
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")

    store.engine.dispose()
    event.listen(store.engine, "connect", full)
    big = '"' + "x" * 500_000 + '"'
    with pytest.raises(StoreUnavailable, match="full"):
        store.ack([Ack(c.lease, big) for c in claimed])
    for c in claimed:  # nothing was written
        job = store.get(c.job_id)
        assert job is not None and job.state.value == "leased"


def test_a_claim_the_database_refuses_is_store_unavailable_and_leases_nothing(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/q.db")
    store.enqueue_many([NewJob("k", "p", "{}", 3) for _ in range(4)])

    def read_only(dbapi_conn, _record) -> None:  # "attempt to write a readonly database"
        dbapi_conn.execute("PRAGMA query_only = ON")

    store.engine.dispose()
    event.listen(store.engine, "connect", read_only)
    with pytest.raises(StoreUnavailable, match="readonly"):
        store.claim(pool="p", kinds=["k"], n=4, node="n", lease=60.0)
    event.remove(store.engine, "connect", read_only)
    store.engine.dispose()
    assert [j.state.value for j in store.list_jobs()] == ["queued"] * 4
    assert len(store.claim(pool="p", kinds=["k"], n=4, node="n", lease=60.0)) == 4


@pytest.mark.postgres
def test_a_claim_on_connections_the_server_dropped_fails_once_then_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim runs on the driver's cursor, past SQLAlchemy's execute: a lost connection is
    invalidated there with the rest of the pool (a restart cut them all), not handed back to
    fail its reset, which the pool logs as an error with a traceback; the next claim gets a
    fresh connection."""
    import psycopg

    with database_url("postgres", tmp_path) as url:
        store = open_store(url)
        try:
            store.enqueue_many([NewJob("k", "p", "{}", 3) for _ in range(4)])
            store.engine.dispose()
            with store.engine.connect() as a, store.engine.connect() as b:  # two in the pool
                pids = [c.exec_driver_sql("SELECT pg_backend_pid()").scalar() for c in (a, b)]
            with psycopg.connect(postgres_base_url(), autocommit=True) as admin:
                for pid in pids:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with caplog.at_level(logging.WARNING, logger="sqlalchemy.pool"):
                with pytest.raises(StoreUnavailable, match="connection"):
                    store.claim(pool="p", kinds=["k"], n=1, node="n", lease=60.0)
                assert len(store.claim(pool="p", kinds=["k"], n=4, node="n", lease=60.0)) == 4
            assert [r.getMessage() for r in caplog.records if r.name.startswith("sqlalchemy")] == []
        finally:
            store.close()


def test_a_driver_connection_closed_under_the_pool_is_store_unavailable(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/q.db")
    store.enqueue_many([NewJob("k", "p", "{}", 3)])

    def close_it(dbapi_conn, _record, _proxy) -> None:  # closed behind the pool's back
        dbapi_conn.close()

    event.listen(store.engine, "checkout", close_it, once=True)
    with pytest.raises(StoreUnavailable):
        store.claim(pool="p", kinds=["k"], n=1, node="n", lease=60.0)
    assert len(store.claim(pool="p", kinds=["k"], n=1, node="n", lease=60.0)) == 1


@pytest.mark.postgres
def test_the_supervisors_connections_bound_every_statement_and_lock_wait(tmp_path: Path) -> None:
    """The store process opens the store ``bounded``: a statement past its time limit, or a
    lock waited for past its limit, fails as StoreUnavailable (retried with backoff) instead
    of holding every call queued behind it. Clients keep PostgreSQL's defaults."""
    with database_url("postgres", tmp_path) as url:
        bounded = open_store(url, bounded=True)
        plain = open_store(url)
        try:
            with bounded.engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "30s"
                assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "10s"
                params = conn.connection.dbapi_connection.info.get_parameters()
                assert params["tcp_user_timeout"] == "30000" and params["keepalives"] == "1"
            with plain.engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "0"
            # what a timeout becomes: the driver's QueryCanceled is StoreUnavailable
            with (
                pytest.raises(StoreUnavailable, match="statement timeout"),
                bounded._auto() as conn,
            ):
                conn.exec_driver_sql("SET statement_timeout = '50ms'")
                conn.exec_driver_sql("SELECT pg_sleep(1)")
        finally:
            bounded.close()
            plain.close()
