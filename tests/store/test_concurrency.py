"""Several real processes drain one queue at once: every job is acked exactly once.

Four spawned processes (each opens its own store: no engine, connection or file handle crosses
a process boundary) claim batches of 50 and ack them until the queue is empty, on SQLite and on
PostgreSQL, with the real clock. A job claimed twice would show up as a duplicate id, as a lost
ack (the second claim replaced the first lease token) or as ``attempts == 2``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
from typing import Any

import pytest

from supervisor.model import Ack, JobState, NewJob
from supervisor.store import open_store

JOBS = 10_000
PROCESSES = 4
BATCH = 50
LEASE = 300.0  # far longer than the test: no lease may expire, so no job may come back
DEADLINE = 60.0  # seconds to wait for the children before failing


def drain(url: str, index: int, start: Any, results: Any) -> None:
    """Child process: open a store, wait for the start gate, claim and ack until empty, and
    report the ids acked and every lease that ``ack`` said was lost."""
    store = open_store(url)
    acked: list[int] = []
    lost: list[int] = []
    try:
        start.wait(timeout=DEADLINE)
        node = f"proc-{index}"
        while claimed := store.claim(
            pool="bulk", kinds={"render"}, n=BATCH, node=node, lease=LEASE
        ):
            lost.extend(x.job_id for x in store.ack([Ack(c.lease, '"ok"') for c in claimed]))
            acked.extend(c.job_id for c in claimed)
        results.put((index, acked, lost, None))
    except BaseException as exc:  # report, so the parent fails with the cause, not a timeout
        results.put((index, acked, lost, repr(exc)))
    finally:
        store.close()


def _enqueue_all(url: str) -> list[int]:
    store = open_store(url)
    try:
        new = [
            NewJob(kind="render", pool="bulk", payload=json.dumps({"i": i}), max_deliveries=3)
            for i in range(JOBS)
        ]
        return [
            jid
            for start in range(0, JOBS, 1000)
            for jid in store.enqueue_many(new[start : start + 1000])
        ]
    finally:
        store.close()


def _run_children(url: str) -> dict[int, tuple[list[int], list[int]]]:
    """Start the children together, collect one report from each, and join them."""
    ctx = mp.get_context("spawn")
    # every child opens its store, then all start together (a spawned child takes a second to
    # import: a gate opened by the parent would open before the first one got there)
    start, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=drain, args=(url, i, start, results)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    reports: dict[int, tuple[list[int], list[int]]] = {}
    try:
        for _ in procs:
            index, acked, lost, error = results.get(timeout=DEADLINE)
            assert error is None, f"process {index} failed: {error}"
            reports[index] = (acked, lost)
    except queue.Empty:
        pytest.fail(f"only {len(reports)} of {PROCESSES} processes reported within {DEADLINE}s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return reports


@pytest.mark.slow
def test_four_processes_ack_every_job_exactly_once(db_url: str) -> None:
    ids = _enqueue_all(db_url)
    reports = _run_children(db_url)

    every_ack = [jid for acked, _ in reports.values() for jid in acked]
    assert len(every_ack) == len(set(every_ack)), "a job was acked by two claims"
    assert set(every_ack) == set(ids)
    assert [lost for _, lost in reports.values()] == [[]] * PROCESSES
    assert sum(1 for acked, _ in reports.values() if acked) >= 2, "no concurrency happened"

    store = open_store(db_url)
    try:
        rows = store.list_jobs(limit=JOBS + 1)
    finally:
        store.close()
    assert len(rows) == JOBS
    assert {r.state for r in rows} == {JobState.DONE}
    assert {r.attempts for r in rows} == {1}


@pytest.mark.postgres
def test_a_cancel_racing_an_ack_reports_the_job_done_not_leased(tmp_path) -> None:
    """PostgreSQL: the cancel reads the job leased, then its update waits on the row an ack is
    finishing; once the ack commits the update takes nothing, and the report must say done."""
    import threading

    import psycopg

    from supervisor.clock import FakeClock
    from supervisor.model import JobState
    from tests.support.databases import database_url
    from tests.support.wait import eventually

    with database_url("postgres", tmp_path) as url:
        store = open_store(url, FakeClock())
        try:
            job_id = store.enqueue(NewJob("render", "bulk", "{}", 3))
            assert store.claim(pool="bulk", kinds=["render"], n=1, node="n", lease=30.0)
            with psycopg.connect(url) as acker:
                acker.execute(
                    "UPDATE fleetd_jobs SET state = 'done', finished_at = 0 WHERE id = %s",
                    [job_id],
                )  # the ack's transaction, not committed yet
                outcome: list = []
                canceller = threading.Thread(target=lambda: outcome.append(store.cancel([job_id])))
                canceller.start()
                with psycopg.connect(url, autocommit=True) as watch:
                    eventually(
                        lambda: (
                            watch.execute(
                                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                                "'Lock' AND query LIKE 'UPDATE fleetd_jobs%%'"
                            ).fetchone()[0]
                            == 1
                        ),
                        timeout=10,
                    )
                acker.commit()
                canceller.join(10)
            (out,) = outcome
            assert out.requested == {} and out.unchanged == {job_id: JobState.DONE}
        finally:
            store.close()
