"""The result path's cost of waking waiters (supervisor/store/finals.py), A/B in one process.

Each cycle claims 64 no-op jobs and acks them; the ack alone is timed. Cycles alternate
A B B A (neither side always first) on one store:

- SQLite: A with the store's announcement hook a no-op (the path as it was), B with the real
  announcement, nobody waiting; then one announcement alone.
- PostgreSQL: A the ack statement without its wake-up part (as it was), B the statement as it
  is; with ``--listeners`` sessions LISTENing on fleetd_jobs (as supervisors' store processes
  do: the server signals each on every NOTIFY commit) and, with ``--waiter``, a waiter
  registered (LISTEN fleetd_final, the waiters' lock held shared), so B notifies every batch.

The job table is vacuumed every 50 cycles (PostgreSQL; its dead rows would make later cycles
slower whatever the side). SQLite runs on a temporary file; PostgreSQL in a fresh schema,
dropped at the end.

Examples::

    python -m stress bench-finals --engine sqlite
    python -m stress bench-finals --engine postgres --listeners 2 --waiter
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from stress.arguments import engine_arguments, engines, positive_int
from stress.bench_e2e import scratch_database
from supervisor.model import Ack, NewJob
from supervisor.store import open_store
from supervisor.store.finals import FINAL_CHANNEL, WAITER_LOCK

HELP = "the result path's cost of waking waiters: ack with and without it, A/B in one process"
BATCH = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_arguments(parser)
    parser.add_argument("--cycles", type=positive_int, default=1200, help="claim+ack cycles")
    parser.add_argument(
        "--listeners", type=int, default=2, help="sessions LISTENing on fleetd_jobs (PostgreSQL)"
    )
    parser.add_argument(
        "--waiter", action="store_true", help="a waiter registered meanwhile (PostgreSQL)"
    )


def run(args: argparse.Namespace) -> int:
    for engine in engines(args):
        with scratch_database(engine, args.postgres_url, "finals") as (_, url):
            store = open_store(url)
            try:
                out = _sqlite(store, args) if engine == "sqlite" else _postgres(store, url, args)
            finally:
                store.close()
        print(json.dumps({"engine": engine, **out}), flush=True)
    return 0


def _fill(store: Any, cycles: int) -> None:
    job = NewJob(kind="noop", pool="p", payload="{}", max_deliveries=3)
    for _ in range(0, BATCH * cycles + 1000, 1000):
        store.enqueue_many([job] * 1000)


def _cycle(store: Any) -> float:
    claimed = store.claim(pool="p", kinds={"noop"}, n=BATCH, node="n", lease=60)
    acks = [Ack(c.lease, "null", None, 0.0) for c in claimed]
    start = time.perf_counter()
    lost = store.ack(acks)
    took = time.perf_counter() - start
    assert not lost and len(acks) == BATCH, "the queue ran dry or an ack was lost"
    return took


def _abba(cycles: int, set_side: Any, store: Any, every_50: Any = None) -> dict[str, float]:
    times: dict[str, list[float]] = {"A": [], "B": []}
    for i in range(cycles):
        side = ("AB" if (i // 2) % 2 == 0 else "BA")[i % 2]
        set_side(side)
        times[side].append(_cycle(store))
        if every_50 is not None and i % 50 == 49:
            every_50()
    a, b = (statistics.median(times[s]) for s in "AB")
    return {"A_ms": round(a * 1000, 3), "B_ms": round(b * 1000, 3), "B/A": round(b / a, 3)}


def _sqlite(store: Any, args: argparse.Namespace) -> dict[str, Any]:
    _fill(store, args.cycles)
    real = store._finals_committed

    def set_side(side: str) -> None:
        store._finals_committed = real if side == "B" else (lambda ids: None)

    out = _abba(args.cycles, set_side, store)
    store._finals_committed = real
    announcer, n = store._announcer, 100_000
    start = time.perf_counter()
    for _ in range(n):
        announcer.announce((1, 2, 3))
    out["announce_nobody_waiting_us"] = round((time.perf_counter() - start) / n * 1e6, 3)
    out["waiters_found"] = len(announcer._targets)
    return out


def _postgres(store: Any, url: str, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg
    from sqlalchemy import text

    _fill(store, args.cycles)
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    listeners = [psycopg.connect(plain, autocommit=True) for _ in range(args.listeners)]
    for conn in listeners:
        conn.execute("LISTEN fleetd_jobs")
    waiter = None
    if args.waiter:
        waiter = psycopg.connect(plain, autocommit=True)
        waiter.execute(f"LISTEN {FINAL_CHANNEL}; {WAITER_LOCK}")
    now = store._ack_batch_stmt
    marker = "            )\n            SELECT id, lease_token,"
    assert marker in now.text, "the ack statement changed shape: update this benchmark"
    before = text(now.text.replace("WITH acked AS (", "").split(marker)[0])
    heard = 0

    def set_side(side: str) -> None:
        store.__dict__["_ack_batch_stmt"] = now if side == "B" else before

    def upkeep() -> None:
        nonlocal heard
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute("VACUUM fleetd_jobs")
        for conn in listeners:
            list(conn.notifies(timeout=0))
        if waiter is not None:
            heard += len(list(waiter.notifies(timeout=0)))

    try:
        out = _abba(args.cycles, set_side, store, upkeep)
        upkeep()  # what the last cycles' NOTIFYs brought
    finally:
        store.__dict__["_ack_batch_stmt"] = now
        for conn in [*listeners, *([waiter] if waiter else [])]:
            conn.close()
    return {**out, "listeners": args.listeners, "waiter": args.waiter, "notifies_heard": heard}
