"""Keep the store benchmark, and what it found, from rotting.

- ``python -m stress bench-store --quick --engine sqlite`` exits 0 and prints its tables (no
  timing is asserted: figures belong in docs/benchmarks.md); so does ``bench-bare``, the
  reference loop fleetd's end-to-end figures are read against, on both engines.
- SQLite's claim walks ix_jobs_claim and stops after n rows. Without the ``likely()`` hint its
  planner sorted every ready row on each claim (42 ms at 100,000 queued, and growing).
- PostgreSQL: the reaper vacuums the job table once dead rows pile up, so a claim reads a few
  index pages again instead of walking every entry that earlier claims left behind; and it
  analyzes the table when the planner believes in far fewer queued jobs than there are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from supervisor.clock import FakeClock
from supervisor.model import Ack, NewJob
from supervisor.store import open_store
from tests.support.databases import postgres_base_url, postgres_schema_url

ROOT = Path(__file__).resolve().parents[2]


def run_stress(*command: str, timeout: float = 90) -> str:
    """``python -m stress <command>``: its output, once it exited 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "stress", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},  # rich would cut headers at 80 columns
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_bench_store_quick_runs_and_prints_a_table() -> None:
    out = run_stress("bench-store", "--quick", "--engine", "sqlite")
    assert "bench-store: rates" in out and "claim+ack x64" in out
    assert "sqlite" in out and "2,000" in out  # one row: the engine and the queue size
    assert "over a long run" in out


@pytest.mark.slow
@pytest.mark.postgres
def test_bench_bare_finishes_every_job_on_both_engines() -> None:
    # the bench makes and drops a schema of its own on the suite's PostgreSQL; it raises
    # (exits non-zero) unless every job was acked
    out = run_stress("bench-bare", "--jobs", "2000", "--postgres-url", postgres_base_url())
    rows = [line for line in out.splitlines() if "2000" in line]
    assert len(rows) == 2 and "sqlite" in rows[0] and "postgres" in rows[1]


@pytest.mark.slow
@pytest.mark.postgres
def test_bench_e2e_runs_on_both_engines_and_leaves_no_schema_behind() -> None:
    import psycopg

    base = postgres_base_url()
    plain = base.replace("postgresql+psycopg://", "postgresql://")

    def bench_schemas() -> set[str]:
        with psycopg.connect(plain) as conn:
            query = "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_e2e_%'"
            return {row[0] for row in conn.execute(query)}

    before = bench_schemas()
    command = ["bench-e2e", "--jobs", "300", "--pickups", "1", "--long", "1"]
    command += ["--postgres-url", base]
    out = run_stress(*command, timeout=120)
    rows = [line for line in out.splitlines() if " 300 " in line]
    assert len(rows) == 2 and "sqlite" in rows[0] and "postgres" in rows[1], out
    assert bench_schemas() <= before  # its schema was dropped (other runs' may remain)


def _fill(store: Any, count: int) -> None:
    new = NewJob(kind="render", pool="bulk", payload=json.dumps({"n": 1}), max_deliveries=3)
    for start in range(0, count, 1000):
        store.enqueue_many([new] * min(1000, count - start))


def _claim_ack(store: Any, n: int) -> int:
    claimed = store.claim(pool="bulk", kinds={"render"}, n=n, node="t", lease=60)
    assert store.ack([Ack(c.lease) for c in claimed]) == []
    return len(claimed)


def _claim_statement(store: Any) -> tuple[str, Any]:
    """The SQL and parameters the store sends for one claim."""
    return store.claim_statement(pool="bulk", kinds={"render"}, n=1, node="t", lease=60)


def test_sqlite_claim_walks_the_claim_index_without_sorting(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'plan.db'}", FakeClock())
    try:
        _fill(store, 3000)
        sql, params = _claim_statement(store)
        with store.engine.connect() as conn:
            plan = [r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params)]
    finally:
        store.close()
    assert any("USING INDEX ix_jobs_claim" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


def _claim_index_pages(store: Any, sql: str, params: Any) -> int:
    """Index pages the claim's scan reads, from EXPLAIN ANALYZE in a rolled-back transaction."""
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        cursor = raw.cursor()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        report = cursor.fetchone()[0][0]
        raw.rollback()
    nodes = [report["Plan"]]
    while nodes:
        node = nodes.pop()
        if node.get("Index Name") == "ix_jobs_claim":
            return int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])
        nodes.extend(node.get("Plans", []))
    raise AssertionError(f"the claim does not scan ix_jobs_claim: {report}")


def _vacuum_when_due(store: Any, clock: FakeClock, seconds: float) -> bool:
    """Call ``vacuum_if_due`` as the reaper would until it runs (statistics reach the server
    within about a second) or ``seconds`` pass; whether it ran."""
    from supervisor.store.postgres import VACUUM_MIN_INTERVAL

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        clock.advance(VACUUM_MIN_INTERVAL)
        if store.vacuum_if_due():
            return True
        time.sleep(0.3)
    return False


def _horizon_holders(store: Any, seconds: float) -> list[str]:
    """Other transactions of this database open for more than ``seconds``: VACUUM may not
    remove row versions they could still see."""
    query = text(
        "SELECT pid, state, left(query, 60) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_xmin IS NOT NULL AND xact_start < now() - make_interval(secs => :s)"
    )
    with store.engine.connect() as conn:
        return [str(tuple(r)) for r in conn.execute(query, {"s": seconds})]


@pytest.mark.postgres
@pytest.mark.slow
# alone: a VACUUM cannot remove rows that another session's snapshot may still see, and
# the server's autovacuum and ANALYZE are every schema's: no neighbour on the server
@pytest.mark.alone
def test_postgres_reaper_vacuums_once_dead_rows_pile_up() -> None:
    clock = FakeClock()
    with postgres_schema_url() as url:
        store = open_store(url, clock)
        try:
            _fill(store, 8000)
            sql, params = _claim_statement(store)
            assert store.vacuum_if_due() is False  # a fresh table: nothing to do
            began = time.monotonic()
            for _ in range(100):
                _claim_ack(store, 64)  # 6,400 claims leave ~12,800 dead row versions
            walked = _claim_index_pages(store, sql, params)
            ran = _vacuum_when_due(store, clock, seconds=20)
            after = _claim_index_pages(store, sql, params)
            holders = _horizon_holders(store, time.monotonic() - began) if after > 5 else []
        finally:
            store.close()
    assert walked > 20, f"expected dead entries to walk before the vacuum, read {walked}"
    assert ran, "vacuum_if_due never saw the dead rows within 20 s"
    if holders:
        pytest.skip(f"older transactions hold back what VACUUM may remove: {holders}")
    assert after <= 5, f"the claim still reads {after} index pages after the vacuum"


@pytest.mark.postgres
@pytest.mark.slow
# alone: a VACUUM cannot remove rows that another session's snapshot may still see, and
# the server's autovacuum and ANALYZE are every schema's: no neighbour on the server
@pytest.mark.alone
def test_postgres_reaper_analyzes_a_backlog_the_planner_does_not_know_of() -> None:
    # A table never analyzed estimates one queued row: with 40,000 queued the planner read
    # them all through a smaller index and sorted them on every claim (21 ms a claim, not 1)
    clock = FakeClock()
    with postgres_schema_url() as url:
        store = open_store(url, clock)
        try:
            _fill(store, 500)
            few = store.analyze_if_due()  # too few queued to matter
            _fill(store, 40_000)
            clock.advance(5.0)
            ran = store.analyze_if_due()
            sql, params = _claim_statement(store)
            pages = _claim_index_pages(store, sql, params)  # asserts the claim uses ix_jobs_claim
            clock.advance(5.0)
            again = store.analyze_if_due()  # the planner knows now: nothing to do
        finally:
            store.close()
    assert few is False
    assert ran is True
    assert pages <= 5, f"the claim reads {pages} index pages"
    assert again is False


@pytest.mark.postgres
def test_bench_finals_runs_and_a_registered_waiter_hears_every_batch() -> None:
    base = postgres_base_url()
    out = run_stress("bench-finals", "--cycles", "8", "--postgres-url", base, timeout=120)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["engine"] for r in rows] == ["sqlite", "postgres"], out
    assert rows[0]["waiters_found"] == 0 and rows[1]["notifies_heard"] == 0
    out = run_stress(
        "bench-finals",
        "--engine",
        "postgres",
        "--cycles",
        "8",
        "--waiter",
        "--postgres-url",
        base,
        timeout=120,
    )
    (row,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["notifies_heard"] >= 4  # each of the 4 B acks notified (other schemas may add)
