"""The database goes away while jobs run (PostgreSQL behind a proxy the test cuts): the
supervisor keeps running, retries with backoff, and loses no job.

- A short outage (well inside the lease): the running job keeps its lease and finishes once,
  and jobs enqueued during the outage run after it.
- An outage longer than the lease: the worker is killed (never run a job whose lease you do not
  hold); after the database returns the expired lease is reaped and the job runs again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest

from supervisor.model import ErrorKind, JobState
from supervisor.store import open_store
from tests.integration.fleet import Harness, Supervisor, handlers, wait_gone
from tests.support.databases import postgres_schema_url
from tests.support.tcpproxy import TcpProxy
from tests.support.wait import eventually

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    tcp = TcpProxy("127.0.0.1", 5432)
    yield tcp
    tcp.close()


@pytest.fixture
def fleet(tmp_path: Path, proxy: TcpProxy, start_supervisor) -> Iterator[Harness]:
    """Supervisors reach PostgreSQL through the proxy; the test's store connects directly."""
    with postgres_schema_url() as url:
        parts = urlsplit(url)
        if (parts.hostname, parts.port or 5432) != ("127.0.0.1", 5432):
            pytest.fail(f"the outage tests proxy 127.0.0.1:5432, not {parts.netloc}")
        user = f"{parts.username}@" if parts.username else ""
        proxied = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
        store = open_store(url)
        try:
            yield Harness(tmp_path, proxied, store, start_supervisor)
        finally:
            store.close()


def start(fleet: Harness, lease: str) -> Supervisor:
    fleet.configure(
        {
            "work": {
                "handlers": handlers("sleep", "echo"),
                "min_workers": 2,
                "max_workers": 2,
                "lease": lease,
                "heartbeat": "0.5s",
                "max_deliveries": 3,
            }
        },
    )
    return fleet.start()


def test_a_short_outage_loses_nothing_and_keeps_the_lease(fleet: Harness, proxy: TcpProxy) -> None:
    tcp = proxy
    sup = start(fleet, lease="6s")
    running = fleet.enqueue("sleep", {"seconds": 3})
    fleet.wait_state([running], JobState.LEASED)
    tcp.cut()
    during = [fleet.enqueue("echo", {"n": n}) for n in range(3)]  # the test's own connection
    time.sleep(1.5)  # deliberately: the outage itself
    sup.check_alive()
    tcp.restore()
    jobs = fleet.wait_final([running, *during], timeout=20, watch=[sup])
    assert all(j.state == JobState.DONE and j.attempts == 1 for j in jobs), jobs
    assert len(fleet.executions(running)) == 1  # ran once: the lease was never lost
    log = sup.log()
    assert "store unavailable" in log and "reachable again" in log


def test_an_outage_longer_than_the_lease_kills_the_job_and_it_runs_again(
    fleet: Harness, proxy: TcpProxy
) -> None:
    tcp = proxy
    sup = start(fleet, lease="2s")
    # the first run outlasts any delay in seeing it start and in the kill, the second is quick
    job_id = fleet.enqueue("sleep", {"first_seconds": 30, "seconds": 0.2})
    running = eventually(
        lambda: [w for w in sup.workers(fleet.store, "work") if w["job"] == job_id]
    )
    tcp.cut()
    worker = eventually(lambda: sup.descendant(running[0]["pid"]))
    wait_gone([worker], timeout=3)  # killed when its 2 s lease ran out unextended
    sup.check_alive()  # the worker died, not the supervisor
    time.sleep(1.0)  # deliberately: the outage outlasts the lease by a margin
    tcp.restore()
    (job,) = fleet.wait_final([job_id], timeout=30, watch=[sup])
    assert job.state == JobState.DONE and job.attempts == 2, job
    assert job.error_kind == ErrorKind.LEASE_EXPIRED  # the history of the first delivery
    runs = fleet.executions(job_id)
    assert [r["attempt"] for r in runs] == [2]  # the killed run never finished
    assert "lease" in sup.log()


@pytest.mark.parametrize("busy", [True, False], ids=["a-job-running", "idle"])
def test_the_loop_sleeps_through_an_outage_whose_calls_fail_fast(
    fleet: Harness, proxy: TcpProxy, busy: bool
) -> None:
    """The database refuses connections for 12 s (every call fails at once): the loop backs
    off between calls and sleeps meanwhile. A heartbeat or a reap falling due during a backoff
    once kept the loop at ~100 % CPU for the whole outage."""
    fleet.configure(
        {
            "work": {
                "handlers": handlers("sleep", "echo"),
                "min_workers": 1,
                "max_workers": 1,
                "lease": "30s",
                "heartbeat": "1s",
                "max_deliveries": 3,
            }
        }
    )
    sup = fleet.start()
    sup.wait_workers(fleet.store, "work", 1)
    if busy:
        job = fleet.enqueue("sleep", {"seconds": 25})
        fleet.wait_state([job], JobState.LEASED)
    parent = psutil.Process(sup.pid)
    proxy.cut()
    t0, cpu0 = time.monotonic(), sum(parent.cpu_times()[:2])
    time.sleep(12)
    used, wall = sum(parent.cpu_times()[:2]) - cpu0, time.monotonic() - t0
    proxy.restore()
    assert used < 0.3 * wall, f"{used:.1f}s of supervisor CPU in {wall:.1f}s of outage"
    sup.check_alive()
