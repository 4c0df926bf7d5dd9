"""A fresh worker per job: no-op jobs/s through ``fleetd start`` with ``max_jobs_per_worker =
1`` and 2 workers, beside a bare fork-per-job loop run in the same session, and the time from
fork to Ready of one worker.

- **bare**: a parent that imported sqlalchemy, rich, pydantic, psutil and click (so a fork
  copies a page table of that size) forks a child per job, 2 at once; it sends the child a
  JSON job over a pipe, the child answers a JSON result and exits, the parent reaps it. No
  database, no limits, no supervision: the ceiling for "a fresh process per job" here.
- **fleetd**: a pre-enqueued backlog of no-op jobs drains through a real supervisor (pool of
  2 workers, ``max_jobs_per_worker = 1``, ``memory_limit`` 256 MiB so the rlimit, the
  watchdog and, where the host allows, a memory cgroup per worker are all in force); jobs/s
  from the database (first ``started_at`` to last ``finished_at``).
- **fork to Ready**: ``fork_worker`` from this process (which imported what the supervisor
  imports), timed until the worker's ``Ready`` frame, then ``Shutdown``; with and without a
  memory cgroup attached the way the supervisor attaches one.

Examples::

    python -m stress bench-fresh --engine sqlite
    python -m stress bench-fresh --jobs 2000 --forks 200
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import time
from pathlib import Path

import click  # noqa: F401  (imported for the bare loop's page table, as the issue describes)
import psutil
import pydantic  # noqa: F401
import sqlalchemy  # noqa: F401
from rich.console import Console
from rich.table import Table

from stress.arguments import engine_arguments, engines, positive_int
from stress.bench_e2e import running_supervisor, scratch_database, write_fleet
from stress.fixtures import noop
from supervisor.client import Client
from supervisor.model import JobState

HELP = "a fresh worker per job: max_jobs_per_worker = 1 beside a bare fork-per-job loop"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_arguments(parser)
    parser.add_argument("--jobs", type=positive_int, default=2000)
    parser.add_argument("--bare-jobs", type=positive_int, default=5000)
    parser.add_argument("--forks", type=positive_int, default=100, help="fork-to-Ready samples")
    parser.add_argument("--workers", type=positive_int, default=2)


def run(args: argparse.Namespace) -> int:
    console = Console()
    bare = bare_loop(args.bare_jobs, args.workers)
    table = Table(title=f"a fresh worker per job ({args.workers} at once, no-op jobs)")
    columns = ("run", "jobs", "jobs/s", "÷ bare", "per worker: job to job", "loop CPU/job")
    for name in (*columns, "forker CPU/job"):
        table.add_column(name, justify="right")
    table.add_row("bare fork-per-job loop", str(args.bare_jobs), f"{bare:,.0f}", "1.00", "", "", "")
    for engine, cgroup in [(e, c) for e in engines(args) for c in (True, False)]:
        with scratch_database(engine, args.postgres_url, "fresh") as (folder, url):
            rate, cpu, forker_cpu = fleetd_rate(folder, url, args.jobs, args.workers, cgroup)
        gap = args.workers / rate * 1000
        table.add_row(
            f"fleetd, {engine}" + ("" if cgroup else ", memory_cgroup = false"),
            str(args.jobs),
            f"{rate:,.0f}",
            f"{rate / bare:.2f}",
            f"{gap:.1f} ms",
            f"{cpu * 1000:.2f} ms",
            f"{forker_cpu * 1000:.2f} ms",
        )
    console.print(table)
    ready = fork_to_ready(args.forks, cgroup=False)
    timing = Table(title=f"fork to Ready ({args.forks} forks, one at a time)")
    for name in ("worker", "p50", "p90", "max"):
        timing.add_column(name, justify="right")
    timing.add_row("no cgroup", *_quantiles(ready))
    timing.add_row(
        "through a forker, no cgroup", *_quantiles(fork_to_ready(args.forks, forker=True))
    )
    with_cg = fork_to_ready(args.forks, cgroup=True)
    if with_cg:
        timing.add_row("memory cgroup (attach + remove)", *_quantiles(with_cg))
    console.print(timing)
    return 0


def bare_loop(jobs: int, at_once: int) -> float:
    """Jobs per second of the bare fork-per-job loop."""
    start = time.perf_counter()
    running: dict[int, tuple[int, int]] = {}  # pid -> (read fd, job)
    sent = done = 0
    while done < jobs:
        while len(running) < at_once and sent < jobs:
            to_child_r, to_child_w = os.pipe()
            from_child_r, from_child_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(to_child_w)
                os.close(from_child_r)
                job = json.loads(os.read(to_child_r, 65536))
                os.write(from_child_w, json.dumps({"id": job["id"], "result": None}).encode())
                os._exit(0)
            os.close(to_child_r)
            os.close(from_child_w)
            os.write(to_child_w, json.dumps({"id": sent, "payload": {}}).encode())
            os.close(to_child_w)
            running[pid] = (from_child_r, sent)
            sent += 1
        pid, _ = os.wait()
        fd, job = running.pop(pid)
        result = json.loads(os.read(fd, 65536))
        assert result["id"] == job
        os.close(fd)
        done += 1
    return jobs / (time.perf_counter() - start)


def fleetd_rate(
    folder: Path, url: str, jobs: int, workers: int, cgroup: bool = True
) -> tuple[float, float, float]:
    """No-op jobs per second through ``fleetd start`` with a fresh worker per job, the
    supervisor's own CPU seconds per job (its loop: fork requests, reaps, cgroups, frames)
    and its forker's (forks and reaps; the workers' own CPU not included)."""
    config = write_fleet(
        folder,
        url,
        f"""memory_cgroup = {"true" if cgroup else "false"}
[pools.fresh]
handlers = {{ noop = "stress.fixtures:noop" }}
bound = "io"
min_workers = {workers}
max_workers = {workers}
max_jobs_per_worker = 1
memory_limit = "256MiB"
""",
    )
    with Client.from_config(config) as client:
        ids = client.enqueue_many([("noop", {}) for _ in range(jobs)])
        with running_supervisor(config, folder / "log") as proc:
            parent = psutil.Process(proc.pid)
            while client.get(ids[0]).state is not JobState.DONE:
                time.sleep(0.01)
            (forker,) = [c for c in parent.children() if c.name() == "fleetd: forker"]
            cpu0, fcpu0, n0 = _cpu(parent), _cpu(forker), _done(client, ids)
            while client.get(ids[-1]).state is not JobState.DONE:
                time.sleep(0.1)
            while any(client.get(i).state is not JobState.DONE for i in ids[-20:]):
                time.sleep(0.05)
            cpu1, fcpu1, n1 = _cpu(parent), _cpu(forker), _done(client, ids)
        done = [j for j in client.store.list_jobs(limit=jobs + 10) if j.finished_at]
    first = min(j.started_at for j in done if j.started_at)
    last = max(j.finished_at for j in done if j.finished_at)
    n = max(1, n1 - n0)
    return len(done) / (last - first), (cpu1 - cpu0) / n, (fcpu1 - fcpu0) / n


def _cpu(proc: psutil.Process) -> float:
    """CPU seconds so far of the supervisor process itself (not its children)."""
    times = proc.cpu_times()
    return times.user + times.system


def _done(client: Client, ids: list[int]) -> int:
    return sum(1 for j in client.store.list_jobs(limit=len(ids) + 10) if j.finished_at)


def fork_to_ready(forks: int, *, cgroup: bool = False, forker: bool = False) -> list[float]:
    """Seconds from fork to the worker's Ready frame, one worker at a time: forked here, or
    (``forker``) by a forker started from here, the request's round trip included."""
    from supervisor.run.forklink import start_forker
    from supervisor.run.memcg import MemoryCgroups
    from supervisor.run.workerproc import fork_worker
    from workers import protocol
    from workers.spec import WorkerSpec

    memcg = MemoryCgroups(enabled=cgroup, pid=os.getpid())
    memcg.start()
    if cgroup and memcg.base is None:
        return []
    handlers = {"noop": noop}
    link = start_forker({"fresh": handlers}) if forker else None
    spec = WorkerSpec(
        pool="fresh",
        slot=1,
        handlers=handlers,
        parent_pid=os.getpid(),
        memory_limit=256 << 20,
        max_jobs_per_worker=1,
    )
    out = []
    try:
        for _ in range(forks):
            start = time.perf_counter()
            if link is not None:
                worker = link.fork_worker(spec, now=0.0)
            else:
                worker = fork_worker(spec, now=0.0, child_cleanup=lambda: None)
            memcg.attach(worker, spec.memory_limit)
            worker.sock.setblocking(True)
            msg = protocol.read_frame(worker.fd)
            out.append(time.perf_counter() - start)
            assert isinstance(msg, protocol.Ready), msg
            protocol.write_frame(worker.fd, protocol.Shutdown())
            if link is not None:
                while not (exits := link.take_exits()):
                    select.select([link.sock], [], [], 5.0)
                for pid, _ in exits:
                    link.reaped(pid)
                status = 0
            else:
                _, status = os.waitpid(worker.pid, 0)
            memcg.worker_exited(worker, status, 0.0)
            worker.sock.close()
    finally:
        memcg.close()
        if link is not None:
            link.close(1.0)
    return out


def _quantiles(samples: list[float]) -> list[str]:
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return [
        f"{statistics.median(samples) * 1000:.2f} ms",
        f"{q[8] * 1000:.2f} ms",
        f"{max(samples) * 1000:.2f} ms",
    ]
