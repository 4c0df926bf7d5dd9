"""The bare reference: the smallest program with fleetd's shape, timed on the same machine.

A parent claims no-op jobs from a minimal table in batches of 100 (leases, never deletes),
feeds 2 forked children length-prefixed JSON over socket pairs (up to 50 in flight each), reads
their results and acks them in batches of 100. No supervision: no titles, limits, heartbeats,
retries, watchdog, metrics or logs. It is what fleetd's per-job cost is measured against
(``fleetd's jobs/s ÷ this``), because absolute figures move with the machine: the same commit
ran ~13,000 and ~24,000 no-op jobs/s on two days on "the same" two vCPUs.

Examples::

    python -m stress bench-bare                     # SQLite and PostgreSQL
    python -m stress bench-bare --engine sqlite --jobs 20000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import sqlite3
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from stress.arguments import engine_arguments, engines, positive_int
from stress.bench_e2e import scratch_database

HELP = "the bare reference: a minimal claim/feed/ack loop that fleetd's figures are read against"
BATCH = 100  # jobs claimed, and acked, per statement
IN_FLIGHT = 50  # jobs sent to a child ahead of its results
LEASE = 30.0
HEADER = struct.Struct(">I")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_arguments(parser)
    parser.add_argument("--jobs", type=positive_int, default=20000)
    parser.add_argument("--children", type=positive_int, default=2)


def run(args: argparse.Namespace) -> int:
    table = Table(title=f"bare reference ({args.children} children, no-op jobs)")
    for name in ("engine", "jobs", "jobs/s", "parent CPU/1k jobs", "children CPU/1k jobs"):
        table.add_column(name, justify="right")
    for engine in engines(args):
        with scratch_database(engine, args.postgres_url, "bare") as (folder, url):
            db = _sqlite(str(folder / "bare.db")) if engine == "sqlite" else _postgres(url)
            try:
                got = measure(db, args.jobs, args.children)
            finally:
                db.close()
        table.add_row(
            engine,
            str(args.jobs),
            f"{got.rate:,.0f}",
            f"{got.parent_cpu * 1e6:.1f} ms",
            f"{got.children_cpu * 1e6:.1f} ms",
        )
    Console().print(table)
    return 0


@dataclass
class Db:
    """The three statements the loop needs, on one connection."""

    enqueue: Callable[[int], None]
    claim: Callable[[int], list[tuple[int, str]]]
    ack: Callable[[list[tuple[str, int]]], None]
    close: Callable[[], None]


@dataclass
class Figures:
    rate: float  # jobs/s
    parent_cpu: float  # seconds per job
    children_cpu: float  # seconds per job


def _sqlite(path: str) -> Db:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY, state INTEGER NOT NULL, payload TEXT NOT NULL,"
        " lease_until REAL, result TEXT)"
    )
    conn.execute("CREATE INDEX jobs_queued ON jobs (id) WHERE state = 0")

    def enqueue(n: int) -> None:
        with conn:
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO jobs (state, payload) VALUES (0, ?)", [("{}",)] * n)

    def claim(n: int) -> list[tuple[int, str]]:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(
            "UPDATE jobs SET state = 1, lease_until = ? WHERE id IN"
            " (SELECT id FROM jobs WHERE state = 0 ORDER BY id LIMIT ?) RETURNING id, payload",
            (time.time() + LEASE, n),
        ).fetchall()
        conn.execute("COMMIT")
        return rows

    def ack(done: list[tuple[str, int]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("UPDATE jobs SET state = 2, result = ? WHERE id = ? AND state = 1", done)
        conn.execute("COMMIT")

    return Db(enqueue, claim, ack, conn.close)


def _postgres(url: str) -> Db:
    """On ``url``, a connection whose search_path is a scratch schema (``scratch_database``)."""
    import psycopg

    conn = psycopg.connect(url)
    conn.execute(
        "CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, state INTEGER NOT NULL,"
        " payload TEXT NOT NULL, lease_until DOUBLE PRECISION, result TEXT)"
    )
    conn.execute("CREATE INDEX jobs_queued ON jobs (id) WHERE state = 0")
    conn.commit()

    def enqueue(n: int) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO jobs (state, payload) VALUES (0, %s)", [("{}",)] * n)
        conn.commit()

    def claim(n: int) -> list[tuple[int, str]]:
        rows = conn.execute(
            "UPDATE jobs SET state = 1, lease_until = %s WHERE id IN (SELECT id FROM jobs"
            " WHERE state = 0 ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, payload",
            (time.time() + LEASE, n),
        ).fetchall()
        conn.commit()
        return rows

    def ack(done: list[tuple[str, int]]) -> None:
        ids = [job_id for _, job_id in done]
        results = [result for result, _ in done]
        conn.execute(
            "UPDATE jobs SET state = 2, result = r.result FROM unnest(%s::bigint[], %s::text[])"
            " AS r(id, result) WHERE jobs.id = r.id AND jobs.state = 1",
            (ids, results),
        )
        conn.commit()

    return Db(enqueue, claim, ack, conn.close)


def measure(db: Db, jobs: int, children: int) -> Figures:
    """Enqueue ``jobs``, then time the loop from the first claim to the last ack."""
    db.enqueue(jobs)
    reaped_before = _children_cpu()
    socks = [_fork_child() for _ in range(children)]
    try:
        before = _cpu()
        t0 = time.perf_counter()
        done = _drive(db, socks)
        elapsed = time.perf_counter() - t0
        after = _cpu()
    finally:
        for sock in socks:
            sock.close()
        for _ in socks:
            os.wait()
    if done != jobs:
        raise RuntimeError(f"bare loop finished {done} of {jobs} jobs")
    return Figures(
        rate=done / elapsed,
        parent_cpu=(after - before) / done,
        children_cpu=(_children_cpu() - reaped_before) / done,
    )


def _drive(db: Db, socks: list[socket.socket]) -> int:
    """The parent's loop: claim when a child has room, send, read results, ack in batches."""
    selector = selectors.DefaultSelector()
    in_flight = {s.fileno(): 0 for s in socks}
    pending = {s.fileno(): b"" for s in socks}
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    buffer: list[tuple[int, str]] = []
    acks: list[tuple[str, int]] = []
    done = 0
    drained = False
    while True:
        room = sum(IN_FLIGHT - n for n in in_flight.values())
        if not drained and len(buffer) < room:
            got = db.claim(BATCH)
            drained = not got
            buffer.extend(got)
        for sock in socks:
            fd = sock.fileno()
            n = min(IN_FLIGHT - in_flight[fd], len(buffer))
            if n > 0 and (in_flight[fd] == 0 or 2 * n >= IN_FLIGHT):
                batch, buffer[:n] = buffer[:n], []
                out = b"".join(_frame([job_id, payload]) for job_id, payload in batch)
                sock.sendall(out)
                in_flight[fd] += n
        if drained and not buffer and not any(in_flight.values()):
            break
        for key, _ in selector.select():
            fd = key.fd
            bodies, pending[fd] = _split(pending[fd] + os.read(fd, 65536))
            for job_id, result in bodies:
                acks.append((result, job_id))
            in_flight[fd] -= len(bodies)
        if len(acks) >= BATCH or (acks and not any(in_flight.values())):
            db.ack(acks)
            done += len(acks)
            acks = []
    selector.close()
    return done


def _fork_child() -> socket.socket:
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        code = 0
        try:
            _child(child)
        except BaseException:
            code = 1
        os._exit(code)
    child.close()
    return parent


def _child(sock: socket.socket) -> None:
    """Run no-op jobs until EOF: one result frame written per job."""
    fd = sock.fileno()
    data = b""
    while chunk := os.read(fd, 65536):
        jobs, data = _split(data + chunk)
        for job_id, payload in jobs:
            result = _noop(json.loads(payload))
            os.write(fd, _frame([job_id, json.dumps(result)]))


def _noop(payload: object) -> None:
    return None


def _split(data: bytes) -> tuple[list[Any], bytes]:
    """The complete frames' decoded bodies at the start of ``data``, and the bytes left."""
    bodies, at = [], 0
    while len(data) - at >= HEADER.size:
        (size,) = HEADER.unpack_from(data, at)
        end = at + HEADER.size + size
        if end > len(data):
            break
        bodies.append(json.loads(data[at + HEADER.size : end]))
        at = end
    return bodies, data[at:]


def _frame(body: object) -> bytes:
    text = json.dumps(body).encode()
    return HEADER.pack(len(text)) + text


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _children_cpu() -> float:
    """CPU seconds of every child reaped so far (cumulative: subtract an earlier reading)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
