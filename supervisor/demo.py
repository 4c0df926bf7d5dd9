"""``fleetd demo``: run the demo fleet of conf/demo.toml against a mix of ordinary and hostile
jobs, show the jobs' states live, then drain the supervisor with SIGTERM and summarise.

The supervisor runs as a real ``fleetd start`` subprocess: this is what users run, not a
simulation. The demo only enqueues and reads the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from supervisor.client import Client
from supervisor.config.fleet import FleetConfig
from supervisor.errors import FleetdError
from supervisor.model import Job, JobState

MIX: list[tuple[str, dict[str, object]]] = [
    *[("thumbnail", {"image": i}) for i in range(20)],
    *[("render", {"doc": i, "seconds": 0.3}) for i in range(12)],
    *[("flaky", {"call": i}) for i in range(3)],
    *[("parse_upload", {"upload": f"invoice-{i}.pdf"}) for i in range(6)],
    ("word_count", {"text": "an external program, contained like any job"}),
    *[
        ("parse_upload", {"upload": bad})
        for bad in ("zip-bomb", "huge-alloc", "infinite-loop", "segfault", "garbage")
    ],
]


SCHEDULED_WANTED = 3  # the demo runs until this many of its schedules' jobs have finished


def run_demo(config_path: str, seconds: float, console: Console | None = None) -> int:
    console = console or Console()
    with Client.from_config(config_path) as client:
        log_path = Path(tempfile.mkdtemp(prefix="fleetd-demo-")) / "supervisor.log"
        _, before = client.store.arrivals(after_id=None)  # jobs of earlier runs are not ours
        proc = _start_supervisor(config_path, log_path)
        try:
            ids = client.enqueue_many(MIX)
            console.print(f"enqueued {len(ids)} jobs; supervisor pid {proc.pid}, log {log_path}")
            jobs = _watch(client, ids, before, seconds, proc, console)
        finally:
            _stop(proc, console)
        jobs = [client.get(j.id) for j in jobs]  # as the drain left them
    _summary(jobs, console, client.config)
    mix = [j for j in jobs if j.id in set(ids)]
    return 0 if all(j.state in (JobState.DONE, JobState.DEAD) for j in mix) else 1


def _start_supervisor(config_path: str, log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "supervisor", "start", "-c", config_path],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _scheduled(client: Client, after_id: int) -> list[Job]:
    """The jobs this run's schedule ticks enqueued (keys ``schedule:<name>:<tick>``)."""
    found = client.store.list_jobs(after_id=after_id, limit=10_000)
    return [j for j in found if (j.key or "").startswith("schedule:")]


def _watch(
    client: Client,
    ids: list[int],
    after_id: int,
    seconds: float,
    proc: subprocess.Popen[bytes],
    console: Console,
) -> list[Job]:
    """Until every job of the mix is done or dead and a few scheduled ones finished."""
    deadline = time.monotonic() + seconds
    final = (JobState.DONE, JobState.DEAD)
    jobs = [client.get(i) for i in ids]
    with Live(_table(jobs), console=console, refresh_per_second=4) as live:
        while time.monotonic() < deadline and proc.poll() is None:
            ticks = _scheduled(client, after_id)
            jobs = [client.get(i) for i in ids] + ticks
            live.update(_table(jobs))
            finished = sum(j.state in final for j in ticks)
            if all(j.state in final for j in jobs[: len(ids)]) and finished >= SCHEDULED_WANTED:
                break
            time.sleep(0.25)
    if proc.poll() is not None:
        raise FleetdError(
            f"the supervisor exited early with status {proc.returncode}; see its log above"
        )
    return jobs


def _table(jobs: list[Job]) -> Group:
    counts = Counter((j.pool, str(j.state)) for j in jobs)
    table = Table(title="demo fleet: jobs by pool", box=None, header_style="bold")
    table.add_column("pool")
    for state in JobState:
        table.add_column(str(state), justify="right")
    for pool in sorted({j.pool for j in jobs}):
        table.add_row(pool, *(str(counts[(pool, str(s))]) for s in JobState))
    dead = Table(title="dead letters", box=None, header_style="bold")
    for name in ("id", "payload", "attempts", "error"):
        dead.add_column(name, overflow="fold")
    for j in jobs:
        if j.state is JobState.DEAD:
            dead.add_row(
                str(j.id),
                str(j.payload.get("upload", j.payload)),
                str(j.attempts),
                f"{j.error_kind}: {j.last_error}",
            )
    return Group(table, dead)


def _stop(proc: subprocess.Popen[bytes], console: Console) -> None:
    if proc.poll() is not None:
        return
    console.print("\nsending SIGTERM: the supervisor drains and exits")
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _summary(jobs: list[Job], console: Console, config: FleetConfig) -> None:
    for spec in config.schedule_specs():
        ticks = [j for j in jobs if (j.key or "").startswith(f"schedule:{spec.name}:")]
        done = sum(j.state is JobState.DONE for j in ticks)
        console.print(
            f"schedule {spec.name} ({spec.timing.describe()}): {len(ticks)} tick(s) enqueued, "
            f"{done} done; last for {ticks[-1].payload.get('scheduled_for') if ticks else '-'}"
        )
    states = Counter(str(j.state) for j in jobs)
    kinds = Counter(str(j.error_kind) for j in jobs if j.state is JobState.DEAD)
    console.print(
        f"{states['done']} done, {states['dead']} dead "
        f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items())) or 'none'}), "
        f"{states['queued'] + states['leased']} unfinished"
    )
    console.print(
        "Look closer: fleetd jobs -c conf/demo.toml --state dead; "
        "fleetd dlq list -c conf/demo.toml; fleetd schedules -c conf/demo.toml"
    )
