"""Interactive isolation: an interactive job's pickup latency while 20,000 bulk jobs are
queued, against its figure on an idle fleet. Pools are the isolation: the bulk backlog has its
own workers and its own claims, so the interactive pool's jobs should not wait behind it.

Through a real ``fleetd start`` (subprocess). Pickup = the job's ``started_at - enqueued_at``
from the database; each interactive job is enqueued alone, a random 0.1-0.3 s apart.

    python -m stress bench-isolation [--bulk 20000] [--samples 100] [--engine sqlite|postgres]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from rich.console import Console
from rich.table import Table

from stress.bench_e2e import running_supervisor, scratch_database, write_fleet
from supervisor.client import Client
from supervisor.model import JobState

HELP = "interactive pickup latency with a deep bulk backlog vs an idle fleet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("FLEETD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1/test"),
    )
    parser.add_argument("--bulk", type=int, default=20_000, help="bulk jobs queued")
    parser.add_argument("--samples", type=int, default=100, help="interactive jobs timed")


POOLS = """
[pools.bulk]
handlers = { burn = "stress.fixtures:burn" }
min_workers = 1
max_workers = 1
memory_limit = false

[pools.interactive]
handlers = { noop = "stress.fixtures:noop" }
bound = "io"
min_workers = 1
max_workers = 1
memory_limit = false
"""


def run(args: argparse.Namespace) -> int:
    with scratch_database(args.engine, args.postgres_url, "iso") as (tmp, url):
        config = write_fleet(tmp, url, POOLS)
        with (
            Client.from_config(config) as client,
            running_supervisor(config, tmp / "log"),
        ):
            time.sleep(2.0)  # boot
            idle = _pickups(client, args.samples)
            client.enqueue_many([("burn", {"ms": 5}) for _ in range(args.bulk)])
            backlog = client.store.stats(["bulk"])["bulk"].ready
            busy = _pickups(client, args.samples)
            still = client.store.stats(["bulk"])["bulk"].ready
    _report(args, idle, busy, backlog, still)
    return 0


def _pickups(client: Client, n: int) -> list[float]:
    rng = random.Random(11)
    out = []
    for _ in range(n):
        time.sleep(rng.uniform(0.1, 0.3))
        job = client.wait(client.enqueue("noop", {}), timeout=30)
        assert job.state is JobState.DONE and job.started_at is not None
        out.append(job.started_at - job.enqueued_at)
    return out


def _report(
    args: argparse.Namespace, idle: list[float], busy: list[float], backlog: int, still: int
) -> None:
    table = Table(title=f"interactive pickup, {args.engine}, {args.samples} jobs each")
    for name in ("fleet", "bulk backlog", "p50", "p99", "max"):
        table.add_column(name, justify="right")
    for label, xs, depth in (("idle", idle, "0"), ("bulk queued", busy, f"{backlog:,}→{still:,}")):
        q = statistics.quantiles(xs, n=100, method="inclusive")
        table.add_row(label, depth, _ms(statistics.median(xs)), _ms(q[98]), _ms(max(xs)))
    Console().print(table)
    ratio = (
        statistics.quantiles(busy, n=100, method="inclusive")[98]
        / statistics.quantiles(idle, n=100, method="inclusive")[98]
    )
    Console().print(f"p99 with the backlog / p99 idle: {ratio:.2f}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"
