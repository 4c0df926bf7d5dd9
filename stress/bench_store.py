"""Measure the job store through its real API (``supervisor.store.open_store``).

Rates, for each engine and queue size, on a fresh database filled with that many ready jobs:

- enqueue, one job per call (``enqueue``: one transaction each) and 500 per call
  (``enqueue_many``);
- claim+ack, one job per cycle and 64 per cycle (``claim`` n jobs, then one ``ack`` call);
- the latency of ``stats`` (per-pool counts and the oldest ready job's age), and of the
  oldest-ready query alone (the number that pages), which must stay cheap at any size.

The queue is held at its size: jobs enqueued during a measurement are deleted, and claimed jobs
replaced, between timed segments (untimed, with a bulk INSERT through the store's engine, which
is also how the database is filled; filling is not what is measured).

Flatness, per engine: claim+ack cycles of one job, many in a row, with the cycle time of the
first and last windows. The store's reaper runs every 10 s as ``fleetd start`` runs it with a
60 s lease; on PostgreSQL a second run leaves it out, to show what it is for: every claim
leaves a dead entry at the front of the claim index until a vacuum removes it. On PostgreSQL
each window also records the index pages one claim reads and its time in the server (EXPLAIN
ANALYZE of the store's own claim statement, rolled back): unlike wall time on a busy machine,
those do not depend on what else runs.

Every measurement stops at its time budget or its job cap. SQLite runs on a temporary file;
PostgreSQL in a fresh schema, dropped at the end.

Examples::

    python -m stress bench-store                      # both engines, 10,000 and 1,000,000
    python -m stress bench-store --quick --engine sqlite
    python -m stress bench-store --engine postgres --postgres-url postgresql://u@host/db
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote

HELP = "store throughput and latency: enqueue, claim+ack, stats, claim-cost flatness"
POSTGRES_ENV = "FLEETD_TEST_POSTGRES_URL"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1/test"
POOL, KIND, NODE, LEASE = "bench", "render", "bench-node", 300.0
ENGINES = ("sqlite", "postgres")
T = TypeVar("T")
REAP_EVERY = 10.0  # fleetd start reaps every min(10 s, lease / 4): 10 s with a 60 s lease


@dataclass(frozen=True)
class Plan:
    """What to run: engines, queue sizes, and the bounds of every measurement."""

    engines: tuple[str, ...]
    sizes: tuple[int, ...]
    seconds: float  # timed work per rate measurement
    stats_calls: int
    flat_cycles: int
    flat_window: int
    flat_seconds: float  # hard bound on one flatness run
    flat_without_reaper: bool  # the extra PostgreSQL run with no reaper
    postgres_url: str
    rates: bool = True
    flatness: bool = True


@dataclass
class Rates:
    """One row of the rates table."""

    engine: str
    queued: int
    enqueue_one: float = 0.0  # jobs/s
    enqueue_batch: float = 0.0
    claim_ack_1: float = 0.0
    claim_ack_64: float = 0.0
    stats_ms: float = 0.0  # median latency of store.stats
    oldest_ms: float = 0.0  # median latency of the oldest-ready query alone
    fill_s: float = 0.0  # untimed set-up, shown for reference


@dataclass
class Flatness:
    """One long claim+ack run: per window, the cycle time and (PostgreSQL) the claim's cost
    in the server."""

    engine: str
    reaper: str
    cycles: int = 0
    window: int = 0
    mean_us: list[float] = field(default_factory=list)
    median_us: list[float] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)  # index pages one claim reads
    server_ms: list[float] = field(default_factory=list)
    note: str = ""


# ---- command line -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``bench-store``."""
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument(
        "--sizes", default="10000,1000000", help="queued jobs, comma-separated (%(default)s)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a small run: size 2000, short budgets (~20 s)"
    )
    parser.add_argument(
        "--seconds", type=float, help="time budget per rate measurement (5; quick 0.3)"
    )
    parser.add_argument(
        "--flat-cycles", type=int, help="claim+ack cycles per flatness run (60000; quick 600)"
    )
    parser.add_argument(
        "--part", choices=["all", "rates", "flatness"], default="all", help="what to measure"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES),
        help=f"server for the PostgreSQL runs (default ${POSTGRES_ENV} or {DEFAULT_POSTGRES})",
    )


def plan_from(args: argparse.Namespace) -> Plan:
    """Turn the parsed options into a ``Plan`` (``--quick`` sets small defaults)."""
    engines = ENGINES if args.engine == "both" else (args.engine,)
    sizes = (2000,) if args.quick else tuple(int(s) for s in args.sizes.split(",") if s.strip())
    if not sizes or min(sizes) < 100:
        raise SystemExit("bench-store: --sizes must be numbers of at least 100")
    cycles = args.flat_cycles or (600 if args.quick else 60_000)
    return Plan(
        engines=engines,
        sizes=sizes,
        seconds=args.seconds or (0.3 if args.quick else 5.0),
        stats_calls=5 if args.quick else 21,
        flat_cycles=cycles,
        flat_window=max(1, min(5000, cycles // 6)),
        flat_seconds=10.0 if args.quick else 900.0,
        flat_without_reaper=not args.quick,
        postgres_url=args.postgres_url,
        rates=args.part in ("all", "rates"),
        flatness=args.part in ("all", "flatness"),
    )


def run(args: argparse.Namespace) -> int:
    """Run the plan and print the tables (progress goes to stderr); return the exit code."""
    from rich.console import Console

    plan = plan_from(args)
    console = Console() if sys.stdout.isatty() else Console(width=max(160, Console().width))
    progress = Console(stderr=True)
    console.print(machine_line(plan))
    rows: list[Rates] = []
    flats: list[Flatness] = []
    for engine in plan.engines:
        for size in plan.sizes if plan.rates else ():
            label = f"{engine}: rates at {size:,} queued"
            rows.append(_step(progress, label, partial(measure_size, engine, size, plan)))
        for reap_every in _reapers(engine, plan):
            label = f"{engine}: {plan.flat_cycles:,} claim+ack cycles, reaper {reap_every}"
            flats.append(
                _step(progress, label, partial(measure_flatness, engine, plan, reap_every))
            )
    if rows:
        console.print(rates_table(rows))
    if flats:
        console.print(flatness_table(flats))
    return 0


def _reapers(engine: str, plan: Plan) -> list[float | None]:
    """The flatness runs for one engine: with the reaper, and on PostgreSQL also without."""
    if not plan.flatness:
        return []
    return [REAP_EVERY, None] if engine == "postgres" and plan.flat_without_reaper else [REAP_EVERY]


def _step(progress: Any, label: str, work: Callable[[], T]) -> T:
    """Run one measurement under a status line, and log how long it took."""
    start = time.perf_counter()
    with progress.status(label):
        result = work()
    progress.log(f"{label}: {time.perf_counter() - start:.0f} s")
    return result


# ---- databases ----------------------------------------------------------------------------


@contextmanager
def fresh_store(engine: str, plan: Plan) -> Iterator[Any]:
    """An open, migrated, empty store on a fresh database, removed afterwards."""
    from supervisor.store import open_store

    with _fresh_url(engine, plan.postgres_url) as url:
        store = open_store(url)
        try:
            yield store
        finally:
            store.close()


@contextmanager
def _fresh_url(engine: str, postgres_url: str) -> Iterator[str]:
    if engine == "sqlite":
        with tempfile.TemporaryDirectory(prefix="fleetd-bench-") as folder:
            yield f"sqlite:///{folder}/bench.db"
        return
    import psycopg

    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    schema = "bench_" + uuid.uuid4().hex[:12]
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in postgres_url else "?"
    try:
        yield f"{postgres_url}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


_FILL_COLUMNS = (
    "kind, pool, state, payload, priority, attempts, max_deliveries, extensions,"
    " enqueued_at, available_at"
)
_FILL_VALUES = (
    "SELECT :kind, :pool, 'queued', '{\"n\": ' || i || '}', 0, 0, 3, 0, :t0 + i * 1e-4,"
    " :t0 + i * 1e-4"
)
_FILL_SQL = {
    "sqlite": f"INSERT INTO fleetd_jobs ({_FILL_COLUMNS}) WITH RECURSIVE seq(i) AS"
    f" (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < :n) {_FILL_VALUES} FROM seq",
    "postgresql": f"INSERT INTO fleetd_jobs ({_FILL_COLUMNS}) {_FILL_VALUES}"
    " FROM generate_series(1, :n) AS i",
}


def fill(store: Any, count: int) -> None:
    """Add ``count`` ready jobs in one bulk INSERT through the store's own engine. They are
    dated an hour back, so they are older than anything the measurements enqueue."""
    from sqlalchemy import text

    if count <= 0:
        return
    params = {"n": count, "t0": store.now() - 3600.0, "kind": KIND, "pool": POOL}
    with store.engine.begin() as conn:
        conn.execute(text(_FILL_SQL[store.engine.dialect.name]), params)


def settle(store: Any) -> None:
    """After a bulk fill, write the fill out (checkpoint) so the measurements do not pay for
    it, and on PostgreSQL do what autovacuum does to a table that grew over time (statistics,
    visibility map). SQLite gets no ANALYZE: fleetd never runs it."""
    from sqlalchemy import exc, text

    if store.engine.dialect.name == "sqlite":
        import sqlite3

        with contextlib.closing(sqlite3.connect(store.engine.url.database)) as raw:
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return
    with store.engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        auto.execute(text("VACUUM (ANALYZE) fleetd_jobs"))
        with contextlib.suppress(exc.DBAPIError):  # needs superuser or pg_checkpoint
            auto.execute(text("CHECKPOINT"))


def _delete_from(store: Any, first_id: int) -> None:
    from sqlalchemy import text

    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM fleetd_jobs WHERE id >= :id"), {"id": first_id})


# ---- rates --------------------------------------------------------------------------------


def timed_segments(
    step: Callable[[], int], reset: Callable[[int], None], *, per_segment: int, seconds: float
) -> float:
    """Call ``step`` (returns the jobs it handled) in timed segments of up to ``per_segment``
    jobs, calling ``reset`` (untimed) after each, until ``seconds`` of timed work; jobs/s."""
    jobs, spent = 0, 0.0
    while spent < seconds:
        done, start = 0, time.perf_counter()
        while done < per_segment and time.perf_counter() - start + spent < seconds:
            handled = step()
            if handled == 0:
                raise RuntimeError("the queue ran dry during a measurement")
            done += handled
        spent += time.perf_counter() - start
        jobs += done
        reset(done)
    return jobs / spent


def enqueue_rate(store: Any, size: int, batch: int, seconds: float) -> float:
    """Jobs/s through ``enqueue`` (batch 1) or ``enqueue_many``; the new rows are deleted
    after each segment so the queue stays at ``size``."""
    from supervisor.model import NewJob

    made: list[int] = []
    payload = json.dumps({"doc": 42, "pages": [1, 2, 3]})
    jobs = [NewJob(kind=KIND, pool=POOL, payload=payload, max_deliveries=3)] * batch

    def step() -> int:
        made.extend([store.enqueue(jobs[0])] if batch == 1 else store.enqueue_many(jobs))
        return batch

    def reset(_: int) -> None:
        _delete_from(store, min(made))
        made.clear()

    return timed_segments(step, reset, per_segment=max(batch, size // 10), seconds=seconds)


def claim_ack(store: Any, n: int) -> int:
    """One cycle: claim up to ``n`` jobs, ack them all in one call; the jobs handled."""
    from supervisor.model import Ack

    claimed = store.claim(pool=POOL, kinds={KIND}, n=n, node=NODE, lease=LEASE)
    lost = store.ack([Ack(c.lease, '{"ok": true}') for c in claimed])
    if lost:
        raise RuntimeError(f"{len(lost)} leases lost in a single-process benchmark")
    return len(claimed)


def claim_ack_rate(store: Any, size: int, batch: int, seconds: float) -> float:
    """Jobs/s through claim+ack cycles of ``batch`` jobs; claimed jobs are replaced after
    each segment so the queue stays at ``size``."""
    return timed_segments(
        lambda: claim_ack(store, batch),
        lambda done: fill(store, done),
        per_segment=max(batch, size // 10),
        seconds=seconds,
    )


def median_ms(call: Callable[[], Any], calls: int) -> float:
    """Median wall time of ``call()`` over ``calls`` calls, in milliseconds."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0


def oldest_ready_query(store: Any) -> Callable[[], Any]:
    """The oldest ready job's ``available_at`` as the pool's age metric reads it (one lookup
    in ix_jobs_ready_age), built once; the returned call runs it once."""
    from sqlalchemy import Float, bindparam, func, select

    from supervisor.store.schema import jobs

    query = select(func.min(jobs.c.available_at)).where(
        jobs.c.pool == POOL,
        jobs.c.state == "queued",
        jobs.c.available_at <= bindparam("now", type_=Float(precision=53)),
    )

    def run_once() -> Any:
        with store._auto() as conn:  # the store's own autocommit connection, as stats uses
            return conn.execute(query, {"now": time.time()}).scalar()

    return run_once


def measure_size(engine: str, size: int, plan: Plan) -> Rates:
    """Every rate at one queue size, on a fresh database."""
    row = Rates(engine=engine, queued=size)
    with fresh_store(engine, plan) as store:
        start = time.perf_counter()
        fill(store, size)
        settle(store)
        row.fill_s = time.perf_counter() - start
        row.stats_ms = median_ms(lambda: store.stats([POOL]), plan.stats_calls)
        row.oldest_ms = median_ms(oldest_ready_query(store), plan.stats_calls)
        row.enqueue_one = enqueue_rate(store, size, 1, plan.seconds)
        row.enqueue_batch = enqueue_rate(store, size, 500, plan.seconds)
        row.claim_ack_1 = claim_ack_rate(store, size, 1, plan.seconds)
        row.claim_ack_64 = claim_ack_rate(store, size, 64, plan.seconds)
    return row


# ---- flatness -----------------------------------------------------------------------------


class ClaimProbe:
    """The store's claim statement on PostgreSQL (``claim_statement``), replayed under
    EXPLAIN (ANALYZE, BUFFERS) in a transaction that is rolled back."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.statement: tuple[str, Any] | None = None
        if store.engine.dialect.name == "postgresql":
            self.statement = store.claim_statement(
                pool=POOL, kinds={KIND}, n=1, node="probe", lease=60
            )

    def sample(self) -> tuple[int, float] | None:
        """(index pages the claim's scan read, server execution ms), or None on SQLite."""
        if self.statement is None:
            return None
        sql, params = self.statement
        with self.store.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            cursor = raw.cursor()
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            found = cursor.fetchone()
            raw.rollback()
        report = found[0][0]
        scan = _plan_node(report["Plan"], "Index Scan") or report["Plan"]
        return scan["Shared Hit Blocks"] + scan["Shared Read Blocks"], report["Execution Time"]


def _plan_node(node: dict[str, Any], kind: str) -> dict[str, Any] | None:
    if node.get("Node Type") == kind:
        return node
    for child in node.get("Plans", []):
        if (found := _plan_node(child, kind)) is not None:
            return found
    return None


def measure_flatness(engine: str, plan: Plan, reap_every: float | None) -> Flatness:
    """Claim+ack one job per cycle, ``plan.flat_cycles`` times (or until the time bound), on
    a queue filled once up front, calling ``store.reap()`` every ``reap_every`` seconds."""
    reaper = f"every {reap_every:g} s" if reap_every else "none"
    result = Flatness(engine=engine, reaper=reaper, window=plan.flat_window)
    with fresh_store(engine, plan) as store:
        fill(store, plan.flat_cycles + 10_000)
        settle(store)
        probe = ClaimProbe(store)
        claim_ack(store, 1)  # the probe records the statement
        times = _flat_cycles(store, plan, reap_every, probe, result)
        result.note = vacuum_note(store)
    w = plan.flat_window
    windows = [times[i : i + w] for i in range(0, len(times) - w + 1, w)]
    result.cycles = len(times)
    result.mean_us = [statistics.fmean(x) * 1e6 for x in windows]
    result.median_us = [statistics.median(x) * 1e6 for x in windows]
    return result


def _flat_cycles(
    store: Any, plan: Plan, reap_every: float | None, probe: ClaimProbe, result: Flatness
) -> list[float]:
    """The timed cycles; probe samples go into ``result`` at the start and after each window."""
    times: list[float] = []
    start = time.perf_counter()
    next_reap = start + (reap_every or float("inf"))
    _probe_into(probe, result)
    while len(times) < plan.flat_cycles and time.perf_counter() - start < plan.flat_seconds:
        begin = time.perf_counter()
        claim_ack(store, 1)
        end = time.perf_counter()
        times.append(end - begin)
        if len(times) % plan.flat_window == 0:
            _probe_into(probe, result)
        if end >= next_reap:
            store.reap()  # untimed, as it runs between claims in the supervisor's loop
            next_reap = time.perf_counter() + (reap_every or float("inf"))
    return times


def _probe_into(probe: ClaimProbe, result: Flatness) -> None:
    sample = probe.sample()
    if sample is not None:
        result.pages.append(sample[0])
        result.server_ms.append(sample[1])


def vacuum_note(store: Any) -> str:
    """What PostgreSQL's statistics say about dead rows and vacuums of the job table."""
    from sqlalchemy import text

    if store.engine.dialect.name != "postgresql":
        return "no MVCC: rows change in place"
    query = (
        "SELECT n_dead_tup, autovacuum_count, vacuum_count,"
        " current_setting('autovacuum') FROM pg_stat_user_tables"
        " WHERE relid = 'fleetd_jobs'::regclass"
    )
    with store.engine.connect() as conn:
        dead, auto, manual, setting = conn.execute(text(query)).one()
    return (
        f"{dead:,} dead rows left; {manual} vacuums (1 after the fill); "
        f"autovacuum={setting}, ran {auto}x"
    )


# ---- output -------------------------------------------------------------------------------


def machine_line(plan: Plan) -> str:
    """Cores, memory and versions, for the record."""
    import sqlite3

    import psutil
    import sqlalchemy

    parts = [
        f"{os.cpu_count()} cores",
        f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM",
        f"load {os.getloadavg()[0]:.2f}",
        f"Python {platform.python_version()}",
        f"SQLAlchemy {sqlalchemy.__version__}",
        f"SQLite {sqlite3.sqlite_version}",
    ]
    if "postgres" in plan.engines:
        parts.append(_postgres_line(plan.postgres_url))
    return "bench-store: " + ", ".join(parts)


def _postgres_line(url: str) -> str:
    """The server's version and settings that matter here, and one raw round trip."""
    import psycopg

    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, connect_timeout=5, autocommit=True) as conn:
        names = ("server_version", "synchronous_commit", "autovacuum")
        values = [conn.execute(f"SHOW {name}").fetchone() for name in names]
        start = time.perf_counter()
        for _ in range(200):
            conn.execute("SELECT 1").fetchone()
        rtt = (time.perf_counter() - start) / 200 * 1e6
    version, sync, auto = (v[0] if v else "?" for v in values)
    return (
        f"PostgreSQL {version} (synchronous_commit={sync}, autovacuum={auto}; "
        f"raw psycopg SELECT 1 round trip {rtt:.0f} µs)"
    )


def rates_table(rows: list[Rates]) -> Any:
    """The rates table: one row per engine and size."""
    from rich.table import Table

    table = Table(title="bench-store: rates (jobs/s) and latencies (ms, median)")
    table.add_column("engine")
    names = ("queued", "enqueue x1", "enqueue_many x500", "claim+ack x1", "claim+ack x64")
    for name in (*names, "stats ms", "oldest-ready ms", "fill s"):
        table.add_column(name, justify="right")
    for r in rows:
        rates = (r.enqueue_one, r.enqueue_batch, r.claim_ack_1, r.claim_ack_64)
        table.add_row(
            r.engine,
            f"{r.queued:,}",
            *(f"{x:,.0f}" for x in rates),
            f"{r.stats_ms:,.2f}",
            f"{r.oldest_ms:,.3f}",
            f"{r.fill_s:,.1f}",
        )
    return table


def flatness_table(flats: list[Flatness]) -> Any:
    """Claim-cost flatness: first and last window of each run, every window's median, and on
    PostgreSQL the claim's index pages and server time, start -> end."""
    from rich.table import Table

    table = Table(title="bench-store: claim+ack x1 over a long run (cycle µs per window)")
    for name in ("engine", "reaper", "cycles", "window"):
        table.add_column(name, justify="right" if name in ("cycles", "window") else "left")
    for name in ("first mean", "last mean", "first median", "last median"):
        table.add_column(name, justify="right")
    for name in ("median per window", "claim index pages", "claim server ms", "notes"):
        table.add_column(name)
    for f in flats:
        ends = [f"{x[0]:,.0f}" if x else "-" for x in (f.mean_us, f.mean_us[-1:])]
        ends += [f"{x[0]:,.0f}" if x else "-" for x in (f.median_us, f.median_us[-1:])]
        table.add_row(
            f.engine,
            f.reaper,
            f"{f.cycles:,}",
            f"{f.window:,}",
            *ends,
            " ".join(f"{m:.0f}" for m in f.median_us),
            " ".join(str(p) for p in f.pages) or "-",
            " ".join(f"{m:.2f}" for m in f.server_ms) or "-",
            f.note,
        )
    return table
