"""Measure the capped, fair claim at depth, through the store's real API.

For each engine, on a fresh database:

- ``deep``: one tenant with 1,000, then (a fresh database) 100,000 ready jobs (a bulk
  import), and one with 10: the two depths under the same conditions show whether cost grows;
- ``tenants``: the same, plus 1,000 more tenants with 10 jobs each.

In each, cycles of one timed claim of ``n`` = 4 jobs and an untimed release of them (so the
queue keeps its depth), for: the plain claim (no caps: one statement, SKIP LOCKED); a pool cap
alone (``max_inflight = 50``); pool and tenant caps (``max_inflight = 50``,
``tenant_max_inflight = 1``); a claim that finds the pool full (the common case of a
downstream-bound pool with a backlog); and the rate-limited claim (``claim_rated``) with tokens
to spare, with a kind rate too, and held by an empty bucket. Statistics are collected first
(ANALYZE), as autovacuum would on PostgreSQL, so the planners see a real distribution; on
PostgreSQL the job table is vacuumed before each variant, as the reaper's vacuum keeps it in a
running fleet.

Wall time on a shared machine is noisy, so each result also carries a measure of work that does
not depend on the machine's load: on SQLite the virtual-machine instructions one claim executes
(median, counted in hundreds by a progress handler), on PostgreSQL the shared buffers and the
server's execution time of the capped claim's candidate read (EXPLAIN ANALYZE of the store's
own statement, right after the vacuum, with k = 4 rows per tenant over a window of 64 tenants).

Examples::

    python -m stress bench-caps
    python -m stress bench-caps --engine sqlite --cycles 100
    python -m stress bench-caps --depths 20000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

HELP = "claim cost with fleet-wide caps, fair shares and rate limits, at depth and many tenants"
POSTGRES_ENV = "FLEETD_TEST_POSTGRES_URL"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1/test"
POOL, KIND = "bench", "render"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--postgres-url", default=os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES))
    parser.add_argument(
        "--depths", default="1000,100000", help="the big tenant's jobs, one database each"
    )
    parser.add_argument("--tenants", type=int, default=1000, help="small tenants, 10 jobs each")
    parser.add_argument("--cycles", type=int, default=300, help="claims timed per variant")
    parser.add_argument("--json", action="store_true", help="one JSON object per result")


@contextmanager
def _database(engine: str, postgres_url: str) -> Iterator[str]:
    if engine == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/bench.db"
        return
    import psycopg

    schema = "bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in postgres_url else "?"
    try:
        yield f"{postgres_url}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _fill(store: Any, depth: int, tenants: int) -> None:
    """Add ``depth`` jobs of the tenant "bulk-import" and 10 of "small" (when ``depth``), and
    10 jobs for each of ``tenants`` more tenants; then collect statistics."""
    from supervisor.model import NewJob

    def jobs(tenant: str, count: int) -> Iterator[NewJob]:
        return (NewJob(KIND, POOL, "{}", 3, tenant=tenant) for _ in range(count))

    batch: list[NewJob] = []
    sources = [jobs("bulk-import", depth), jobs("small", 10)] if depth else []
    sources += [jobs(f"t{i:05d}", 10) for i in range(tenants)]
    for source in sources:
        for new in source:
            batch.append(new)
            if len(batch) == 5000:
                store.enqueue_many(batch)
                batch = []
    if batch:
        store.enqueue_many(batch)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")


class _Steps:
    """SQLite virtual-machine instructions executed, counted in hundreds by a progress handler
    on every connection of the store's engine."""

    EVERY = 100

    def __init__(self, store: Any) -> None:
        from sqlalchemy import event

        self.count = 0
        store.engine.dispose()  # new connections get the handler
        event.listen(store.engine, "connect", self._attach)

    def _attach(self, dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.set_progress_handler(self._tick, self.EVERY)

    def _tick(self) -> int:
        self.count += 1
        return 0  # carry on


def _time_claims(
    store: Any, limits: Any, cycles: int, steps: _Steps | None, n: int = 4, rate: Any = None
) -> dict[str, float]:
    from supervisor.run.storecalls import claimed_job
    from supervisor.store.claim import ClaimRequest

    times, work = [], []
    claim = {"pool": POOL, "kinds": {KIND}, "n": n, "node": "bench", "lease": 300.0}
    for _ in range(cycles):
        before = steps.count if steps else 0
        start = time.perf_counter()
        if rate is None:
            got = store.claim(**claim, limits=limits)
        else:
            got = [
                claimed_job(r)
                for r in store.claim_rated(ClaimRequest(**claim, limits=limits), rate).rows
            ]
        times.append(time.perf_counter() - start)
        work.append(((steps.count if steps else 0) - before) * _Steps.EVERY)
        store.release([c.lease for c in got])  # back in the queue: the depth stays
    times.sort()
    result = {
        "median_ms": statistics.median(times) * 1e3,
        "p95_ms": times[int(len(times) * 0.95) - 1] * 1e3,
        "p99_ms": times[int(len(times) * 0.99) - 1] * 1e3,
    }
    if steps:
        result["vm_instructions"] = statistics.median(work)
    return result


def _vacuum(store: Any) -> None:
    """PostgreSQL: clear the dead row versions earlier claims left in the indexes, as the
    reaper's vacuum (and autovacuum) do in a running fleet; otherwise each variant would walk
    the previous ones' leftovers."""
    if store.engine.dialect.name != "postgresql":
        return
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            "VACUUM ANALYZE fleetd_jobs"
        )


def _explain_candidates(store: Any) -> dict[str, float]:
    """PostgreSQL: the server's work for one read of the candidates (k = 4, 64 tenants)."""
    params = {
        "c_pool": POOL,
        "c_kinds": [KIND],
        "c_full": [],
        "c_k": 4,
        "c_tenants": 64,
        "c_first": 1,
        "c_after": "",
        "c_bounded": 0,
        "c_until": "",
    }
    with store.engine.connect() as conn:
        result = store._exec(conn, store._candidates_stmt, params)
        statement, bound = result.context.statement, result.context.parameters[0]
        result.close()
        plan = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, bound
        ).scalar_one()
    top = plan[0]
    return {
        "server_ms": top["Execution Time"],
        "buffers": top["Plan"]["Shared Hit Blocks"] + top["Plan"]["Shared Read Blocks"],
    }


def _time_full(store: Any, cycles: int, steps: _Steps | None) -> dict[str, float]:
    """Claims that find the pool at its cap: fill the cap, then time claims that get nothing."""
    from supervisor.model import Ack, ClaimLimits

    limits = ClaimLimits(max_inflight=4)
    held = store.claim(pool=POOL, kinds={KIND}, n=4, node="bench", lease=300.0, limits=limits)
    _vacuum(store)
    try:
        result = _time_claims(store, limits, cycles, steps)
    finally:
        store.ack([Ack(c.lease) for c in held])
    return result


def _rates() -> dict[str, Any]:
    """Rate-limited claims: with tokens to spare (the pool's bucket; a kind's too, which goes
    through the capped claim's per-kind read), and held (an empty bucket: nothing is taken,
    a probe says whether a job was ready)."""
    from supervisor.rates import Bucket, RateLimit

    plenty = Bucket(1e9, 1e9)
    return {
        "rate": RateLimit(plenty),
        "rate + kind rate": RateLimit(plenty, {KIND: plenty}),
        "rate held": RateLimit(Bucket(1e-9, 1.0)),  # its one token goes on the first claim
    }


def _measure(engine: str, url: str, depth: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    from supervisor.model import ClaimLimits
    from supervisor.store import open_store

    out = []
    store = open_store(url)
    steps = _Steps(store) if engine == "sqlite" else None
    try:
        for scenario, big, tenants in (("deep", depth, 0), ("tenants", 0, args.tenants)):
            _fill(store, big, tenants)  # "tenants" adds to what "deep" left
            about = {"engine": engine, "depth": depth}
            variants = {
                "plain": None,
                "pool cap": ClaimLimits(max_inflight=50),
                "pool+tenant caps": ClaimLimits(max_inflight=50, tenant_max_inflight=1),
            }
            for name, limits in variants.items():
                _vacuum(store)
                work = _explain_candidates(store) if engine == "postgres" and limits else {}
                result = _time_claims(store, limits, args.cycles, steps) | work
                out.append({**about, "scenario": scenario, "claim": name, **result})
            full = _time_full(store, args.cycles, steps)
            out.append({**about, "scenario": scenario, "claim": "pool full", **full})
            for name, rate in _rates().items():  # the rate-limited claim (store/rated.py)
                _vacuum(store)
                result = _time_claims(store, None, args.cycles, steps, rate=rate)
                out.append({**about, "scenario": scenario, "claim": name, **result})
    finally:
        store.close()
    return out


def run(args: argparse.Namespace) -> int:
    engines = ("sqlite", "postgres") if args.engine == "both" else (args.engine,)
    results = []
    depths = [int(d) for d in args.depths.split(",")]
    for engine in engines:
        for depth in depths:
            with _database(engine, args.postgres_url) as url:
                results += _measure(engine, url, depth, args)
    if args.json:
        for r in results:
            print(json.dumps(r))
        return 0
    print(f"depth: one tenant's jobs (+ 10 of another); 'tenants' adds {args.tenants:,} tenants")
    print(
        f"{'engine':9} {'depth':>7} {'scenario':8} {'claim (n=4)':17} "
        f"{'median':>8} {'p95':>8} {'p99':>8}  work"
    )
    for r in results:
        if "vm_instructions" in r:
            work = f"{r['vm_instructions']:,.0f} VM instructions"
        elif "buffers" in r:
            work = f"read: {r['buffers']} buffers, {r['server_ms']:.2f}ms in the server"
        else:
            work = ""
        print(
            f"{r['engine']:9} {r['depth']:7,} {r['scenario']:8} {r['claim']:17} "
            f"{r['median_ms']:7.2f}ms {r['p95_ms']:7.2f}ms {r['p99_ms']:7.2f}ms  {work}"
        )
    return 0
