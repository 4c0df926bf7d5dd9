"""One worker's cost per job, alone: a worker forked from this process (``workers.runtime``,
as ``fleetd start`` runs it, with the pool options that cost a job something: a private
/dev/shm when run as root, the deadline alarm, per-job peak RSS) is fed no-op ``RunJob``
frames 32 at a time, at most 64 ahead of its results, as the supervisor's loop feeds a
pipelining pool. The figures: jobs per second, and the worker's CPU time (user + system,
psutil) per job. With no supervisor, store or other worker competing for the cores, it
says what the worker's own per-job work costs, which end-to-end runs mix with everything
else.

Examples::

    python -m stress bench-worker
    python -m stress bench-worker --jobs 200000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import time

import psutil
from rich.console import Console
from rich.table import Table

from stress import fixtures
from stress.arguments import positive_int
from stress.bench_e2e import cpu_seconds
from workers import protocol
from workers.runtime import WorkerSpec, main

HELP = "one worker's CPU per no-op job, fed as the loop feeds a pipelining pool"
BATCH = 32  # frames in one write, as the loop tops a worker up once half its room is free
AHEAD = 64  # jobs sent and not answered, at most (the pipeline's default depth)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int, default=100_000)
    parser.add_argument("--rounds", type=positive_int, default=3)


def run(args: argparse.Namespace) -> int:
    table = Table(title=f"one worker, {args.jobs:,} no-op jobs a round")
    for name in ("round", "jobs/s", "worker CPU µs/job"):
        table.add_column(name, justify="right")
    costs = []
    for n in range(1, args.rounds + 1):
        rate, cost = _round(args.jobs)
        costs.append(cost)
        table.add_row(str(n), f"{rate:,.0f}", f"{cost * 1e6:.1f}")
    table.add_row("median", "", f"{statistics.median(costs) * 1e6:.1f}")
    Console(width=100).print(table)
    return 0


def _round(jobs: int) -> tuple[float, float]:
    """(jobs per second, worker CPU seconds per job) of one worker over ``jobs`` jobs."""
    spec = WorkerSpec(
        pool="bench",
        slot=1,
        handlers={"noop": fixtures.noop},
        parent_pid=os.getpid(),
        max_jobs_per_worker=None,
        hard_deadline=61.0,
        private_shm=True,  # taken only as root, as in fleetd start
        end_job_tree=False,  # a pool of Python handlers: the default
    )
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child ends in os._exit
        try:
            ours.close()
            main(theirs.fileno(), spec)
        finally:
            os._exit(1)
    theirs.close()
    try:
        ours.setblocking(False)
        reader = protocol.FrameReader()
        _results(ours, reader, 0)  # Ready
        worker = psutil.Process(pid)
        wall, cpu = time.perf_counter(), cpu_seconds([worker])
        sent = done = 0
        deadline = time.time() + 3600
        while done < jobs:
            if sent < jobs and sent - done + BATCH <= AHEAD:
                frames = b"".join(
                    protocol.encode(protocol.RunJob(i, "noop", "{}", 1, deadline, "t"))
                    for i in range(sent, sent + BATCH)
                )
                ours.setblocking(True)
                ours.sendall(frames)
                ours.setblocking(False)
                sent += BATCH
                continue
            done += _results(ours, reader, 1)
        wall, cpu = time.perf_counter() - wall, cpu_seconds([worker]) - cpu
        ours.setblocking(True)
        ours.sendall(protocol.encode(protocol.Shutdown()))
    finally:
        ours.close()
        os.waitpid(pid, 0)
    return done / wall, cpu / done


def _results(sock: socket.socket, reader: protocol.FrameReader, at_least: int) -> int:
    """Wait for frames; how many results (JobDone) came, at least ``at_least`` (0: any frame)."""
    got = 0
    while True:
        if not select.select([sock], [], [], 30.0)[0]:
            raise RuntimeError("no frame from the worker in 30 s")
        messages, eof, _ = reader.drain(sock.fileno())
        if eof:
            raise RuntimeError("the worker exited")
        got += sum(isinstance(m, protocol.JobDone) for m in messages)
        if messages and got >= at_least:
            return got
