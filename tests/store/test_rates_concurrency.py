"""Several real processes claim from one rate-limited pool at once, on SQLite and on
PostgreSQL: the bucket in the database holds the limit however the claims interleave.

Three spawned processes (each with its own store, the real clock: the host's on SQLite, the
server's ``now()`` on PostgreSQL) claim 3 at a time from a pool with a rate of 40/s and a burst
of 4, sleeping until the next token whenever the reply says one is due. The claim's own time
is each job's ``started_at`` (read back after the run); for every pair of starts, the jobs
started between them are at most the burst plus the rate times the time between them: the
token bucket's promise.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import time
from typing import Any

import pytest

from supervisor.model import Ack, JobState, NewJob
from supervisor.rates import Bucket, RateLimit
from supervisor.store import open_store
from supervisor.store.claim import ClaimRequest

JOBS = 60
PROCESSES = 3
RATE, BURST = 40.0, 4.0
LIMIT = RateLimit(Bucket(RATE, BURST))
DEADLINE = 90.0


def worker(url: str, index: int, start: Any, results: Any) -> None:
    """Child: claim until nothing is left; sleep on the reply's wait, never poll faster."""
    store = open_store(url)
    claimed = claims = 0
    try:
        start.wait(timeout=DEADLINE)
        while True:
            got = store.claim_rated(ClaimRequest("bulk", {"render"}, 3, f"p{index}", 300), LIMIT)
            claims += 1
            claimed += len(got.rows)
            if got.rows:
                store.ack([Ack(_lease(row)) for row in got.rows])
            elif store.stats(["bulk"])["bulk"].ready == 0:
                break
            if got.wait is not None:
                time.sleep(got.wait)
        results.put((index, claimed, claims, None))
    except BaseException as exc:
        results.put((index, claimed, claims, repr(exc)))
    finally:
        store.close()


def _lease(row: Any) -> Any:
    from supervisor.run.storecalls import claimed_job

    return claimed_job(row).lease


@pytest.mark.slow
def test_the_rate_holds_under_concurrent_claims(db_url: str) -> None:
    store = open_store(db_url)
    try:
        store.enqueue_many([NewJob("render", "bulk", json.dumps({}), 3) for _ in range(JOBS)])
    finally:
        store.close()
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(db_url, i, start, results)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    per_process = []
    try:
        for _ in procs:
            index, got, _claims, error = results.get(timeout=DEADLINE)
            assert error is None, f"process {index} failed: {error}"
            per_process.append(got)
    except queue.Empty:
        pytest.fail(f"the processes did not finish within {DEADLINE}s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()

    assert sum(per_process) == JOBS, "every job was claimed exactly once"
    assert sum(1 for n in per_process if n) >= 2, "the processes competed for the tokens"
    store = open_store(db_url)
    try:
        rows = store.list_jobs(limit=1000)
    finally:
        store.close()
    assert {r.state for r in rows} == {JobState.DONE} and {r.attempts for r in rows} == {1}
    starts = sorted(r.started_at for r in rows if r.started_at is not None)
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            allowed = BURST + RATE * (starts[j] - starts[i] + 1e-3)
            assert j - i + 1 <= allowed, (
                f"{j - i + 1} jobs started within {starts[j] - starts[i]:.3f}s"
            )
    # 60 jobs at 40/s after a burst of 4: at least (60 - 4) / 40 = 1.4 s from first to last
    assert starts[-1] - starts[0] >= (JOBS - BURST) / RATE - 1e-3


def test_a_claim_that_waited_for_the_lock_keeps_the_later_count_postgres() -> None:
    """PostgreSQL's ``now()`` is when the claim's transaction began, before it waited for the
    pool's claim lock; the claim that held the lock counted the bucket later. The waiting
    claim must not write its earlier time back (the next claim would refill the seconds
    between twice). The other host's claim is played by a connection that holds the lock and
    writes the bucket as a claim does."""
    import threading

    import psycopg

    from supervisor.store.postgres import _CLAIM_LOCKS
    from tests.support.databases import postgres_schema_url

    with postgres_schema_url() as url:
        store = open_store(url)
        try:
            store.enqueue_many([NewJob("render", "bulk", json.dumps({}), 3) for _ in range(3)])
            with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as other:
                other.execute("SELECT pg_advisory_xact_lock(%s, hashtext('bulk'))", (_CLAIM_LOCKS,))
                replies: list[Any] = []
                claim = threading.Thread(
                    target=lambda: replies.append(
                        store.claim_rated(ClaimRequest("bulk", {"render"}, 1, "a", 300), LIMIT)
                    )
                )
                claim.start()

                def waiting() -> bool:
                    row = other.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                        " AND NOT granted AND classid = %s",
                        (_CLAIM_LOCKS,),
                    ).fetchone()
                    return bool(row and row[0])

                from tests.support.wait import eventually

                eventually(waiting, timeout=20)
                counted = other.execute(
                    "INSERT INTO fleetd_rate_buckets (pool, kind, tokens, counted_at)"
                    " VALUES ('bulk', '', 1.0, extract(epoch FROM clock_timestamp()))"
                    " RETURNING counted_at"
                ).fetchone()[0]
                other.commit()  # the lock goes with the transaction
                claim.join(timeout=20)
            assert replies and len(replies[0].rows) == 1
            tokens, at = store.rate_levels("bulk")[""]
            assert tokens == pytest.approx(0.0)
            assert at >= counted, f"the bucket's count went back {counted - at:.6f}s"
        finally:
            store.close()
