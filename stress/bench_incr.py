"""Jobs that each make one network round trip: one ``INCR`` on the local Redis. Beside them,
on the same machine and in the same run, the bare loop: as many processes as fleetd has
workers, each sending INCRs back to back over one connection. The gap between the two is what
fleetd costs a job of this shape: its CPU per job in the supervisor, its store processes and
the workers competes with the Redis server for the same cores.

Examples::

    python -m stress bench-incr                        # SQLite and PostgreSQL, 20,000 jobs
    python -m stress bench-incr --engine sqlite --jobs 5000
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import time

import psutil
from rich.console import Console
from rich.table import Table

from stress.arguments import engine_arguments, engines, host_port, positive_int
from stress.bench_e2e import (
    cpu_seconds,
    fleet_processes,
    running_supervisor,
    scratch_database,
    write_fleet,
)
from stress.fixtures import incr
from supervisor.client import Client
from supervisor.model import JobState

HELP = "one Redis INCR a job through fleetd start, beside the bare INCR loop"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_arguments(parser)
    parser.add_argument("--jobs", type=positive_int, default=20_000)
    parser.add_argument("--workers", type=positive_int, default=2)
    parser.add_argument(
        "--redis", type=host_port, default="127.0.0.1:6379", help="host:port of the Redis"
    )


def run(args: argparse.Namespace) -> int:
    server = args.redis
    try:
        socket.create_connection(server, timeout=2).close()
    except OSError as exc:
        print(f"bench-incr: no Redis at {server[0]}:{server[1]}: {exc}")
        return 2
    table = Table(title=f"one INCR a job ({args.workers} workers or loops, {args.jobs:,} INCRs)")
    for name in ("what", "INCRs/s", "CPU µs/job: supervisor", "store procs", "workers"):
        table.add_column(name, justify="right")
    table.add_row("bare loop", f"{_bare(server, args.jobs, args.workers):,.0f}", "", "", "")
    for engine in engines(args):
        with scratch_database(engine, args.postgres_url, "incr") as (folder, url):
            rate, cpu = _fleetd(folder, url, server, args)
        table.add_row(f"fleetd, {engine}", f"{rate:,.0f}", *(f"{c * 1e6:.0f}" for c in cpu))
    Console().print(table)
    return 0


def _loop(server: tuple[str, int], n: int, start: multiprocessing.synchronize.Event) -> None:
    conn = socket.create_connection(server).makefile("rwb")
    start.wait()
    for _ in range(n):
        incr(conn, b"fleetd:bench:bare")


def _bare(server: tuple[str, int], total: int, loops: int) -> float:
    """INCRs per second of ``loops`` processes sending ``total`` between them."""
    start = multiprocessing.Event()
    procs = [
        multiprocessing.Process(target=_loop, args=(server, total // loops, start))
        for _ in range(loops)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # every process connected and waiting
    t0 = time.perf_counter()
    start.set()
    for proc in procs:
        proc.join()
    return (total // loops * loops) / (time.perf_counter() - t0)


def _fleetd(
    folder: os.PathLike[str], url: str, server: tuple[str, int], args: argparse.Namespace
) -> tuple[float, tuple[float, float, float]]:
    """Jobs per second of a drained backlog (first start to last finish, from the database),
    and CPU seconds per job of the supervisor, its store processes and its workers over it."""
    from pathlib import Path

    config = write_fleet(
        Path(folder),
        url,
        f"""
[pools.bench]
handlers = {{ incr = "stress.fixtures:redis_incr" }}
bound = "io"
min_workers = {args.workers}
max_workers = {args.workers}
memory_limit = false
""",
    )
    payload = {"host": server[0], "port": server[1], "key": "fleetd:bench:jobs"}
    with Client.from_config(config) as client:
        ids = client.enqueue_many([("incr", payload) for _ in range(args.jobs)])
        with running_supervisor(config, Path(folder) / "log") as proc:
            parent = psutil.Process(proc.pid)
            while client.get(ids[0]).state is not JobState.DONE:
                time.sleep(0.01)
            before = _cpu(parent)
            while client.get(ids[-1]).state is not JobState.DONE:
                time.sleep(0.05)
            after = _cpu(parent)
        jobs = client.store.list_jobs(limit=len(ids) + 10)
    first = min(j.started_at for j in jobs if j.started_at)
    last = max(j.finished_at for j in jobs if j.finished_at)
    n = len(ids)
    cpu = tuple((a - b) / n for a, b in zip(after, before, strict=True))
    return n / (last - first), cpu  # type: ignore[return-value]


def _cpu(parent: psutil.Process) -> tuple[float, float, float]:
    """CPU seconds so far of the supervisor (its loop and its forker), its store processes
    and its workers."""
    own = parent.cpu_times()
    stores, forkers, workers = fleet_processes(parent)
    return own.user + own.system + cpu_seconds(forkers), cpu_seconds(stores), cpu_seconds(workers)
