"""Slots: 500 concurrent 1 s sleeps as 500 one-slot workers, and as 25 workers of 20 slots,
through ``fleetd start`` (issue 16).

Per layout and round: a real supervisor with one ``io`` pool (``min_workers = max_workers``,
``memory_limit`` 512 MiB as by default, so the watchdog and the rlimit are in force;
``job_memory`` 8 MiB, about what a sleeping job costs, so the memory ceiling does not stop
500 workers at ~120 on a 24 GiB host) on a scratch database; the time until every worker
says it is idle (its title), then the jobs enqueued in one call and the time until the last
is done (jobs/s = jobs / that time), and the workers' memory sampled every 0.2 s while the
jobs run, the highest sample kept:

- **PSS**: the sum of the workers' proportional set sizes (``smaps_rollup``): shared pages
  split among the processes that map them, so the sum is what they cost together;
- **private + shared once**: the sum of their private pages plus the largest worker's
  shared pages, fleetd's own figure for a pool (docs/memory-limits.md: ``private_at_rest``
  and ``shared_baseline``).

Layouts run interleaved (ABBA...) so load from other users of the machine falls on both;
the table gives each layout's medians and B's ratio to A.

Examples::

    python -m stress bench-slots
    python -m stress bench-slots --rounds 5 --engine postgres
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from stress.arguments import engine_arguments, engines, positive_int
from stress.bench_e2e import fleet_processes, running_supervisor, scratch_database, write_fleet
from supervisor.client import Client
from supervisor.model import JobState
from workers.tree import memory_split

HELP = "slots: 500 concurrent 1 s sleeps as 500 one-slot workers vs 25 workers x 20 slots"
MIB = 1 << 20


@dataclass(frozen=True)
class Layout:
    name: str
    workers: int
    slots: int


@dataclass(frozen=True)
class Result:
    boot: float  # seconds from start until every worker was idle
    took: float  # seconds from the enqueue until the last job was done
    jobs_per_s: float
    pss: int  # bytes, highest sample of the workers' summed PSS
    private_shared: int  # bytes, highest sample of private sum + largest shared


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_arguments(parser)
    parser.set_defaults(engine="sqlite")
    parser.add_argument("--jobs", type=positive_int, default=500)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--slots", type=positive_int, default=20, help="slots per worker in B")
    parser.add_argument("--seconds", type=float, default=1.0, help="each job's sleep")


def run(args: argparse.Namespace) -> int:
    console = Console()
    a = Layout(f"{args.jobs} workers x 1 slot", args.jobs, 1)
    b = Layout(
        f"{-(-args.jobs // args.slots)} workers x {args.slots} slots",
        -(-args.jobs // args.slots),
        args.slots,
    )
    for engine in engines(args):
        results: dict[str, list[Result]] = {a.name: [], b.name: []}
        for i in range(args.rounds):
            order = (a, b) if i % 2 == 0 else (b, a)
            for layout in order:
                with scratch_database(engine, args.postgres_url, "slots") as (folder, url):
                    got = measure(folder, url, layout, args.jobs, args.seconds)
                results[layout.name].append(got)
                console.print(f"{engine} round {i + 1} {layout.name}: {got}")
        console.print(table(engine, args, (a, b), results))
    uname = platform.uname()
    console.print(
        f"machine: {uname.node} {uname.machine}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / (1 << 30):.1f} GiB, Linux {uname.release}, "
        f"Python {platform.python_version()}"
    )
    return 0


def measure(folder: Path, url: str, layout: Layout, jobs: int, seconds: float) -> Result:
    config = write_fleet(
        folder,
        url,
        f"""
[pools.bench]
handlers = {{ sleep = "stress.fixtures:sleep" }}
bound = "io"
min_workers = {layout.workers}
max_workers = {layout.workers}
slots = {layout.slots}
timeout = "60s"
lease = "60s"
job_memory = "8MiB"
""",
    )
    with Client.from_config(config) as client:
        start = time.monotonic()
        with running_supervisor(config, folder / "log") as proc:
            parent = psutil.Process(proc.pid)
            workers = _wait_idle(parent, layout.workers, timeout=300)
            boot = time.monotonic() - start
            begin = time.monotonic()
            ids = client.enqueue_many([("sleep", {"seconds": seconds}) for _ in range(jobs)])
            pss = private_shared = 0
            while not _all_done(client, ids):
                p, ps = _memory(workers)
                pss, private_shared = max(pss, p), max(private_shared, ps)
                time.sleep(0.2)
            took = time.monotonic() - begin
    return Result(boot, took, jobs / took, pss, private_shared)


def _wait_idle(parent: psutil.Process, count: int, timeout: float) -> list[int]:
    """The pids of the pool's workers once ``count`` of them say idle in their title."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        idle = []
        for child in fleet_processes(parent)[2]:
            try:
                title = (child.cmdline() or [""])[0]  # setproctitle pads with empty args
            except psutil.Error:
                continue
            if title.startswith("fleetd: bench#") and title.endswith("idle"):
                idle.append(child.pid)
        if len(idle) >= count:
            return idle
        time.sleep(0.2)
    raise TimeoutError(f"fewer than {count} workers idle after {timeout:.0f}s")


def _all_done(client: Client, ids: list[int]) -> bool:
    """Every job done (the last enqueued first: it is usually the last to finish)."""
    if client.get(ids[-1]).state is not JobState.DONE:
        return False
    jobs = client.store.list_jobs(limit=len(ids) + 10)
    return sum(1 for j in jobs if j.state is JobState.DONE) >= len(ids)


def _memory(pids: list[int]) -> tuple[int, int]:
    """(sum of PSS, sum of private + the largest shared) over ``pids``, bytes."""
    pss = private = shared = 0
    for pid in pids:
        pss += _pss(pid)
        split = memory_split(pid)
        if split is not None:
            private += split[0]
            shared = max(shared, split[1])
    return pss, private + shared


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def table(
    engine: str, args: argparse.Namespace, layouts: tuple[Layout, Layout], results: dict
) -> Table:
    a, b = layouts
    out = Table(
        title=f"{args.jobs} concurrent {args.seconds:g} s sleeps, {engine}, "
        f"medians of {args.rounds} interleaved rounds"
    )
    for name in ("layout", "boot s", "jobs done in s", "jobs/s", "PSS MiB", "private+shared MiB"):
        out.add_column(name, justify="right")

    def med(layout: Layout, field: str) -> float:
        return statistics.median(getattr(r, field) for r in results[layout.name])

    for layout in (a, b):
        out.add_row(
            layout.name,
            f"{med(layout, 'boot'):.1f}",
            f"{med(layout, 'took'):.2f}",
            f"{med(layout, 'jobs_per_s'):.0f}",
            f"{med(layout, 'pss') / MIB:.0f}",
            f"{med(layout, 'private_shared') / MIB:.0f}",
        )
    out.add_row(
        "B / A",
        f"{med(b, 'boot') / med(a, 'boot'):.2f}",
        f"{med(b, 'took') / med(a, 'took'):.2f}",
        f"{med(b, 'jobs_per_s') / med(a, 'jobs_per_s'):.2f}",
        f"{med(b, 'pss') / med(a, 'pss'):.2f}",
        f"{med(b, 'private_shared') / med(a, 'private_shared'):.2f}",
    )
    return out
