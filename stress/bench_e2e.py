"""End-to-end figures through a real ``fleetd start`` (a subprocess, 2 workers by default):

- throughput: no-op jobs per second while a pre-enqueued backlog drains, measured from the
  database (first ``started_at`` to last ``finished_at``), so the supervisor's boot is excluded;
- pickup latency on an idle fleet: one 1 ms job enqueued with ``Client.enqueue`` after the
  fleet has been idle long enough for its poll interval to reach its maximum (1 s); the figure
  is the job's ``started_at - enqueued_at`` from the database; enqueue→done is the time from
  before ``enqueue`` to ``client.wait``'s return;
- ack→wait-return: how long after the job's ack ``client.wait`` returned, for those 1 ms jobs
  and for 1 s jobs: the waiter's wall clock at its return minus the job's ``finished_at``,
  which the ack statement wrote with the same host's clock (SQLite: the store process's
  ``time.time()`` when the ack started; PostgreSQL: ``now()``, its statement's start). The
  commit comes after that time, so the figure includes the commit and overstates the wait by
  as much (~0.1-0.2 ms).

Examples::

    python -m stress bench-e2e                       # SQLite and PostgreSQL
    python -m stress bench-e2e --engine sqlite --jobs 2000 --pickups 10 --long 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from stress.arguments import engine_arguments, engines, positive_int
from supervisor.client import Client
from supervisor.model import JobState

HELP = "end to end: no-op throughput and idle pickup latency through fleetd start"
ROOT = Path(__file__).resolve().parents[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_arguments(parser)
    parser.add_argument(
        "--jobs", type=positive_int, default=5000, help="backlog for the throughput run"
    )
    parser.add_argument("--workers", type=positive_int, default=2)
    parser.add_argument(
        "--pickups", type=positive_int, default=20, help="idle pickups of a 1 ms job to time"
    )
    parser.add_argument(
        "--long", type=positive_int, default=10, help="waits on a 1 s job to time (ack→wait)"
    )


COLUMNS = (
    "engine",
    "jobs",
    "jobs/s",
    "pickup p50",
    "pickup p99",
    "pickup max",
    "enqueue→done p50",
    "enqueue→done p99",
    "ack→wait p50 (1 ms job)",
    "ack→wait p99 (1 ms job)",
    "ack→wait p50 (1 s job)",
    "ack→wait p99 (1 s job)",
    "parent CPU/1k jobs",
    "store procs CPU/1k",
)


def run(args: argparse.Namespace) -> int:
    table = Table(title=f"fleetd end to end ({args.workers} workers, no-op jobs)")
    for name in COLUMNS:
        table.add_column(name, justify="right")
    for engine in engines(args):
        with scratch_database(engine, args.postgres_url, "e2e") as (folder, url):
            row = _measure(folder, url, args)
            table.add_row(engine, *row)
            print(json.dumps(dict(zip(COLUMNS, [engine, *row], strict=True))), flush=True)
    Console(width=250).print(table)
    return 0


@contextmanager
def scratch_database(engine: str, postgres_url: str, name: str) -> Iterator[tuple[Path, str]]:
    """A temporary folder and a database URL for one measurement: a SQLite file in the folder,
    or a fresh PostgreSQL schema, dropped at the end (every run used to leave one behind)."""
    with tempfile.TemporaryDirectory(prefix=f"fleetd-{name}-") as tmp:
        if engine == "sqlite":
            yield Path(tmp), f"sqlite:///{tmp}/{name}.db"
            return
        import psycopg

        schema = f"bench_{name}_{os.getpid()}"
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in postgres_url else "?"
        try:
            yield Path(tmp), f"{postgres_url}{sep}options=-csearch_path%3D{schema}"
        finally:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def write_fleet(folder: Path, url: str, pools: str) -> Path:
    """A fleet.toml for a benchmark: the database, this tree on python_path, and ``pools``
    (TOML text of the ``[pools.*]`` tables)."""
    path = folder / "fleet.toml"
    path.write_text(f"""
[fleet]
database = "{url}"
python_path = ["{ROOT}"]
grace_period = "5s"
{pools}""")
    return path


@contextmanager
def running_supervisor(config: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``fleetd start`` as a subprocess for the block, its stderr to ``log_path``; SIGTERM
    (a drain) at the end."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "start", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def fleet_processes(supervisor: psutil.Process) -> tuple[list[psutil.Process], ...]:
    """A running supervisor's children by role: (its store processes, its forker, its
    workers). The workers are the forker's children (workers/forker.py), and its own
    children that are neither (a dead forker's, until they are reaped)."""
    stores: list[psutil.Process] = []
    forkers: list[psutil.Process] = []
    workers: list[psutil.Process] = []
    for child in supervisor.children():
        try:
            name = child.name()
            if name == "fleetd: forker":
                forkers.append(child)
                workers += child.children()
            else:
                (stores if name.startswith("fleetd: store") else workers).append(child)
        except psutil.Error:
            continue
    return stores, forkers, workers


def _measure(folder: Path, url: str, args: argparse.Namespace) -> list[str]:
    config = write_fleet(
        folder,
        url,
        f"""
[pools.bench]
handlers = {{ noop = "stress.fixtures:noop", sleep = "stress.fixtures:sleep" }}
min_workers = {args.workers}
max_workers = {args.workers}
memory_limit = false
""",
    )
    with Client.from_config(config) as client:
        ids = client.enqueue_many([("noop", {}) for _ in range(args.jobs)])
        with running_supervisor(config, folder / "log") as proc:
            rate, cpu = _throughput(client, ids, psutil.Process(proc.pid))
            pickups, round_trips, after_ack = _pickups(client, args.pickups)
            after_long_ack = _long_waits(client, args.long)
    return [
        str(args.jobs),
        f"{rate:,.0f}",
        _ms(statistics.median(pickups)),
        _ms(_p99(pickups)),
        _ms(max(pickups)),
        _ms(statistics.median(round_trips)),
        _ms(_p99(round_trips)),
        _ms(statistics.median(after_ack)),
        _ms(_p99(after_ack)),
        _ms(statistics.median(after_long_ack)),
        _ms(_p99(after_long_ack)),
        *(["n/a (drain too short)"] * 2 if cpu is None else [_ms(c * 1000) for c in cpu]),
    ]


def _p99(values: list[float]) -> float:
    """The 99th percentile (with 20 samples, close to the largest)."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def _throughput(
    client: Client, ids: list[int], parent: psutil.Process
) -> tuple[float, tuple[float, float] | None]:
    """Jobs per second of the drain, and CPU seconds per job over it of the supervisor and
    of its store processes (user + system, from the first finished job to the last: its boot
    excluded)."""
    first_done: tuple[tuple[float, float], int] | None = None
    while client.get(ids[-1]).state is not JobState.DONE:
        if first_done is None and client.get(ids[0]).state is JobState.DONE:
            first_done = (_cpu(parent), _done(client))
        time.sleep(0.05)
    cpu_end = _cpu(parent)
    jobs = client.store.list_jobs(limit=len(ids) + 10)
    done_end = sum(1 for j in jobs if j.state is JobState.DONE)  # stats() caps its counts
    cpu_per_job = None  # the drain ended before a first reading: too short to tell
    if first_done is not None and done_end > first_done[1]:
        n = done_end - first_done[1]
        cpu_per_job = tuple((e - b) / n for e, b in zip(cpu_end, first_done[0], strict=True))
    first = min(j.started_at for j in jobs if j.started_at)
    last = max(j.finished_at for j in jobs if j.finished_at)
    return len(jobs) / (last - first), cpu_per_job  # type: ignore[return-value]


def _cpu(proc: psutil.Process) -> tuple[float, float]:
    """CPU seconds so far of the supervisor itself, and of its store processes."""
    times = proc.cpu_times()
    return times.user + times.system, cpu_seconds(fleet_processes(proc)[0])


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """CPU seconds so far of ``procs`` (those that are gone count nothing)."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _done(client: Client) -> int:
    return client.store.stats(["bench"])["bench"].done


def _pickups(client: Client, n: int) -> tuple[list[float], list[float], list[float]]:
    """Idle pickups of a 1 ms job: pickup latency, enqueue→done, ack→wait-return."""
    rng = random.Random(7)
    pickups, round_trips, after_ack = [], [], []
    for _ in range(n):
        time.sleep(1.5 + rng.random())  # idle long enough for the poll interval to reach 1 s
        t0 = time.perf_counter()
        job = client.wait(client.enqueue("sleep", {"seconds": 0.001}), timeout=30)
        returned = time.time()
        round_trips.append(time.perf_counter() - t0)
        pickups.append(job.started_at - job.enqueued_at)
        after_ack.append(returned - job.finished_at)
    return pickups, round_trips, after_ack


def _long_waits(client: Client, n: int) -> list[float]:
    """ack→wait-return of 1 s jobs, one at a time."""
    after_ack = []
    for _ in range(n):
        job = client.wait(client.enqueue("sleep", {"seconds": 1.0}), timeout=30)
        after_ack.append(time.time() - job.finished_at)
    return after_ack


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"
