"""The database stalls for 15 s while jobs run, and the supervisor keeps every promise meanwhile.

A stall is worse than an outage: nothing fails, calls just wait. PostgreSQL sits behind a proxy
that stops forwarding with every connection left open (a partition, a stalled server); SQLite
has another process holding ``BEGIN IMMEDIATE`` (a backup, a big import, a ``sqlite3`` shell).
During the stall a hang is killed at its timeout, a memory bomb at its limit, and SIGTERM ends
the supervisor in time with no process left behind. When the database answers again, every
job ends with the right outcome and none is lost; a job that was only running is not dead.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest

from supervisor.model import ErrorKind, JobState
from supervisor.store import open_store
from tests.integration.fleet import Harness, alive, handlers
from tests.integration.test_observability import free_port, get
from tests.support.databases import postgres_schema_url
from tests.support.tcpproxy import TcpProxy
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

STALL = 15.0
GRACE = 1.0
POOLS = {
    "work": {
        "handlers": handlers("hang", "gradual_bomb"),
        "bound": "io",  # two workers whatever the cores
        "min_workers": 2,
        "max_workers": 2,
        "timeout": "2s",
        "memory_limit": "256MiB",
        "max_deliveries": 1,
    },
    "long": {
        "handlers": handlers("sleep"),
        "min_workers": 1,
        "max_workers": 1,
        "timeout": "30s",
        "lease": "30s",
        "heartbeat": "1s",
        "max_deliveries": 1,
    },
}

# holds SQLite's write lock for argv[2] seconds, saying so on stdout once it has it
LOCKER = (
    "import sqlite3, sys, time\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "db.execute('BEGIN IMMEDIATE')\n"
    "print('locked', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "db.execute('COMMIT')\n"
)


class Stall:
    """Start and end a stall of the test's database, by engine."""

    def __init__(self, engine: str, database: str, proxy: TcpProxy | None) -> None:
        self.engine, self.database, self.proxy = engine, database, proxy
        self.locker: subprocess.Popen[str] | None = None
        self.timer: threading.Timer | None = None
        self.seconds = STALL

    def begin(self, seconds: float = STALL) -> None:
        self.seconds = seconds
        if self.proxy is not None:
            self.proxy.stall()
            self.timer = threading.Timer(seconds, self.proxy.resume)
            self.timer.start()
            return
        path = self.database.removeprefix("sqlite:///")
        self.locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, path, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        assert self.locker.stdout is not None
        assert self.locker.stdout.readline().strip() == "locked"

    def end(self) -> None:
        """Wait for the stall's end (the locker lets go after STALL seconds)."""
        if self.timer is not None:
            self.timer.join()
        elif self.locker is not None:
            self.locker.wait(timeout=self.seconds + 10)


def gone(pid: int) -> bool:
    """The process has exited (reaped or a zombie)."""
    try:
        return not alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def stalled(tmp_path: Path, engine: str, start_supervisor) -> Iterator[tuple[Harness, Stall]]:
    """A harness whose supervisors reach the database the way a stall can hit them; the
    test's own store connects directly (on SQLite, its reads pass the write lock)."""
    if engine == "sqlite":
        url = f"sqlite:///{tmp_path / 'fleetd.db'}"
        store = open_store(url)
        try:
            yield Harness(tmp_path, url, store, start_supervisor), Stall(engine, url, None)
        finally:
            store.close()
        return
    proxy = TcpProxy("127.0.0.1", 5432)
    try:
        with postgres_schema_url() as url:
            parts = urlsplit(url)
            user = f"{parts.username}@" if parts.username else ""
            proxied = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
            store = open_store(url)
            try:
                yield Harness(tmp_path, proxied, store, start_supervisor), Stall(engine, url, proxy)
            finally:
                store.close()
    finally:
        proxy.close()


@pytest.mark.alone  # the bomb must reach its limit before its timeout: no neighbour's load
def test_a_stalled_database_stops_no_kill_no_drain_and_loses_nothing(
    stalled: tuple[Harness, Stall],
) -> None:
    fleet, stall = stalled
    port = free_port()
    fleet.configure(POOLS, grace_period=f"{GRACE:g}s", metrics=f"127.0.0.1:{port}")
    sup = fleet.start()
    sup.wait_workers(fleet.store, "work", 2)
    sup.wait_workers(fleet.store, "long", 1)
    hang = fleet.enqueue("hang", {})
    bomb = fleet.enqueue("gradual_bomb", {"delay": 1.5, "announce": True})
    long = fleet.enqueue("sleep", {"seconds": 8})
    fleet.wait_state([hang, bomb, long], JobState.LEASED, timeout=10)
    [hang_run] = eventually(lambda: fleet.executions(hang))
    [bomb_run] = eventually(lambda: fleet.executions(bomb))

    parent = psutil.Process(sup.pid)
    stall.begin()
    stalled_at = time.monotonic()
    cpu_before = sum(parent.cpu_times()[:2])
    try:
        # the hang: killed at its 2 s timeout though every store call now waits
        eventually(lambda: gone(hang_run["pid"]), timeout=6, interval=0.02)
        assert time.time() - hang_run["start"] <= 3.0, "the hang outlived timeout + 1 s"
        # the bomb: 50 MiB every 50 ms from 1.5 s after its start, stopped at its limit
        eventually(lambda: gone(bomb_run["pid"]), timeout=6, interval=0.02)
        assert time.monotonic() - stalled_at < STALL - 5, "not killed during the stall"
        sup.check_alive()
        # SIGTERM during the stall: the drain runs on time and the supervisor exits within
        # grace + 12 s (its releases written when the database answers, or left to expire)
        # 11 s in, past the 10 s after which a snapshot that stopped changing means a stuck
        # loop: /healthz answers from the loop, healthy, and says for how long the store has
        # sat on a call
        time.sleep(max(0.0, stalled_at + 11.0 - time.monotonic()))
        status, body = get(port, "/healthz")
        assert status == 200, body
        waiting = json.loads(body)["store"]["waiting_for"]
        assert waiting is not None and waiting >= 8.0, body
        # waiting is not spinning: the loop sleeps until a reply, a timer or a signal
        busy = sum(parent.cpu_times()[:2]) - cpu_before
        assert busy < 0.5 * (time.monotonic() - stalled_at), f"{busy:.1f}s of CPU in the stall"
        sup.signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = sup.wait_exit(timeout=GRACE + 12 + 5)
        took = time.monotonic() - signalled
        assert took <= GRACE + 12, f"exited {took:.1f}s after SIGTERM"
        assert code == 0, sup.log()
        assert not sup.alive_descendants(), "a worker or the store process outlived it"
    finally:
        stall.end()

    # the database answers again: a second supervisor finishes what was handed back
    second = fleet.start("node-b")
    jobs = {j.id: j for j in fleet.wait_final([hang, bomb, long], timeout=40, watch=[second])}
    assert jobs[hang].state == JobState.DEAD and jobs[hang].error_kind == ErrorKind.TIMEOUT
    assert jobs[bomb].state == JobState.DEAD, jobs[bomb]
    assert jobs[bomb].error_kind == ErrorKind.MEMORY_LIMIT, jobs[bomb]
    # only running when the drain stopped it: released with its delivery given back, not dead
    assert jobs[long].state == JobState.DONE and jobs[long].attempts == 1, jobs[long]
    assert "Traceback" not in sup.log()
    second.stop()  # before the fixture drops the test's database


def test_sigterm_in_a_stall_that_outlasts_the_drain_ends_within_grace_plus_12s(
    stalled: tuple[Harness, Stall],
) -> None:
    """The database stalls for longer than the drain may wait: the running job is killed at
    the end of the grace period, its release cannot be written, and the supervisor still exits
    within grace + 12 s: the drain waits ``WRITE_PATIENCE`` (10 s) for its writes, to the
    instant, then the shutdown closes the store processes within one bound of 0.5 s (the
    release is left to expire into a reaper: nothing is lost)."""
    fleet, stall = stalled
    fleet.configure({"long": POOLS["long"]}, grace_period=f"{GRACE:g}s")
    sup = fleet.start()
    sup.wait_workers(fleet.store, "long", 1)
    job = fleet.enqueue("sleep", {"seconds": 60})
    fleet.wait_state([job], JobState.LEASED, timeout=10)
    sup.wait_workers(fleet.store, "long", 1, "busy")
    stall.begin(seconds=GRACE + 25)
    try:
        sup.signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = sup.wait_exit(timeout=GRACE + 12 + 10)
        took = time.monotonic() - signalled
        assert code == 0, sup.log()
        assert "leases will expire" in sup.log()  # it did wait for its writes, and gave up
        assert GRACE + 10 <= took <= GRACE + 12, f"exited {took:.2f}s after SIGTERM"
        assert not sup.alive_descendants(), "a worker or the store process outlived it"
    finally:
        stall.end()
