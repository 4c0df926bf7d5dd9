"""Stopping a supervisor: SIGTERM drains (jobs released, not failed, and picked up at once by
another supervisor), a second signal skips the grace period, and SIGKILL loses nothing: the
children die with it and a restarted supervisor recovers every job."""

from __future__ import annotations

import signal
import time

import pytest

from supervisor.model import JobState
from tests.integration.fleet import Harness, handlers, wait_gone
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

# long enough that the moment between SIGTERM and the grace period's end (the prefetched jobs
# released, the running ones still leased) is not missed by a poll on a loaded machine
GRACE = 2.0


def states(fleet: Harness, ids: list[int]) -> dict[JobState, list[int]]:
    out: dict[JobState, list[int]] = {s: [] for s in JobState}
    for job in fleet.jobs(ids):
        out[job.state].append(job.id)
    return out


def test_sigterm_releases_jobs_running_past_the_grace_period(fleet: Harness) -> None:
    fleet.configure(
        {
            "slow": {
                "handlers": handlers("sleep"),
                "min_workers": 2,
                "max_workers": 2,
                "prefetch": 2,
                "lease": "5s",
            }
        },
        grace_period=f"{GRACE}s",
    )
    a = fleet.start("node-a")
    ids = [fleet.enqueue("sleep", {"seconds": 30}) for _ in range(4)]
    fleet.wait_state(ids, JobState.LEASED)  # two running, two claimed ahead (prefetch)
    a.wait_workers(fleet.store, "slow", 2, "busy")
    workers = a.worker_processes()
    assert len(workers) == 2

    start = time.monotonic()
    a.signal(signal.SIGTERM)
    # the jobs claimed but not started go back at once; the running ones keep their leases

    def released_early() -> dict[JobState, list[int]] | None:
        now = states(fleet, ids)
        return now if len(now[JobState.QUEUED]) == 2 else None

    during = eventually(released_early, timeout=GRACE / 2)
    assert len(during[JobState.LEASED]) == 2
    assert all(fleet.job(i).attempts == 0 for i in during[JobState.QUEUED])

    assert a.wait_exit(timeout=GRACE + 10) == 0
    took = time.monotonic() - start
    assert took <= GRACE + 1.0, f"exited {took:.2f}s after SIGTERM (grace {GRACE}s)"
    assert "WARNING fleetd.supervisor: drain: killing" in a.log()  # jobs were killed: news
    # at once, no lease to wait for: every job is queued again, its delivery not counted
    for job in fleet.jobs(ids):
        assert job.state == JobState.QUEUED and job.attempts == 0, job
        assert job.owner is None and job.locked_until is None, job
    wait_gone(workers, timeout=1.0)
    assert a.node(fleet.store)["state"] == "stopped"

    b = fleet.start("node-b")
    registered = b.node(fleet.store)
    assert registered is not None
    taken = fleet.wait_state(ids, JobState.LEASED, timeout=10)
    assert {job.owner for job in taken} == {"node-b"}
    assert all(job.attempts == 1 for job in taken)
    pickup = max(job.started_at or 0.0 for job in taken) - registered["started_at"]
    assert pickup < 1.0, f"node-b took {pickup:.2f}s to claim the released jobs"


def test_a_drain_that_ends_in_its_grace_period_logs_at_info(fleet: Harness) -> None:
    """Every job finished within the grace period and every write answered: a drain as it
    should be, said at INFO (a warning is kept for a kill phase or lost writes)."""
    fleet.configure(
        {"quick": {"handlers": handlers("sleep"), "min_workers": 1, "max_workers": 1}},
        grace_period="10s",
    )
    a = fleet.start("node-a")
    job_id = fleet.enqueue("sleep", {"seconds": 0.5})
    fleet.wait_state([job_id], JobState.LEASED)
    a.signal(signal.SIGTERM)
    assert a.wait_exit(timeout=10) == 0
    assert fleet.job(job_id).state == JobState.DONE
    log = a.log()
    assert "INFO fleetd.supervisor: drain: stopped" in log, log
    assert "WARNING fleetd.supervisor: drain:" not in log, log


def test_a_second_signal_skips_the_grace_period(fleet: Harness) -> None:
    fleet.configure(
        {"slow": {"handlers": handlers("sleep"), "min_workers": 1, "max_workers": 1}},
        grace_period="60s",
    )
    a = fleet.start("node-a")
    job_id = fleet.enqueue("sleep", {"seconds": 30})
    fleet.wait_state([job_id], JobState.LEASED)
    a.wait_workers(fleet.store, "slow", 1, "busy")

    a.signal(signal.SIGTERM)
    eventually(lambda: (a.node(fleet.store) or {}).get("state") == "draining", timeout=5)
    start = time.monotonic()
    a.signal(signal.SIGINT)  # Ctrl-C, the second time
    assert a.wait_exit(timeout=10) == 0
    assert time.monotonic() - start < 5.0  # not the 60 s grace period
    (job,) = fleet.jobs([job_id])
    assert job.state == JobState.QUEUED and job.attempts == 0, job


def test_sigkill_of_the_supervisor_loses_no_job(fleet: Harness) -> None:
    fleet.configure(
        {
            "work": {
                "handlers": handlers("sleep"),
                "min_workers": 2,
                "max_workers": 2,
                "lease": "1s",
                "max_deliveries": 3,
            }
        }
    )
    a = fleet.start("node-a")
    ids = [fleet.enqueue("sleep", {"seconds": 0.3}) for _ in range(12)]

    def mid_run() -> bool:
        s = states(fleet, ids)
        return len(s[JobState.DONE]) >= 2 and len(s[JobState.LEASED]) == 2

    eventually(mid_run, timeout=15)
    workers = a.worker_processes()
    assert len(workers) == 2
    a.signal(signal.SIGKILL)
    wait_gone(workers, timeout=1.0)  # PR_SET_PDEATHSIG: no child outlives the supervisor
    assert a.wait_exit(timeout=5) == -signal.SIGKILL
    in_flight = states(fleet, ids)[JobState.LEASED]
    assert in_flight, "the kill came between two jobs; nothing was in flight"

    b = fleet.start("node-a")  # the restarted supervisor; its reaper frees the stale leases
    jobs = fleet.wait_final(ids, timeout=20, watch=[b])
    assert len(fleet.store.list_jobs(limit=1000)) == len(ids)
    for job in jobs:
        assert job.state == JobState.DONE, job
        assert any(r["outcome"] == "ok" for r in fleet.executions(job.id)), job
    for job_id in in_flight:  # the lost delivery counts: attempts 1 expired, 2 done
        assert fleet.job(job_id).attempts == 2, fleet.job(job_id)


def test_a_running_idle_supervisor_takes_released_jobs_at_once(fleet: Harness) -> None:
    """A rolling deploy: node-b is up and idle (its poll interval at its 1 s maximum) when
    node-a drains; the release wakes it, so the jobs move without waiting for a poll."""
    fleet.configure(
        {
            "slow": {
                "handlers": handlers("sleep"),
                "min_workers": 2,
                "max_workers": 2,
                "lease": "5s",
            }
        },
        grace_period="0.5s",
    )
    a = fleet.start("node-a")
    ids = [fleet.enqueue("sleep", {"seconds": 30}) for _ in range(2)]
    fleet.wait_state(ids, JobState.LEASED)
    a.wait_workers(fleet.store, "slow", 2, "busy")
    b = fleet.start("node-b")
    time.sleep(2.5)  # deliberately idle: node-b's empty polls back off to 1 s apart
    a.signal(signal.SIGTERM)
    assert a.wait_exit(timeout=10) == 0
    taken = fleet.wait_state(ids, JobState.LEASED, timeout=10)
    assert {job.owner for job in taken} == {"node-b"}
    for job in taken:  # a release sets available_at to its own time
        lag = (job.started_at or 0.0) - job.available_at
        assert 0 <= lag < 0.25, f"node-b took {lag:.2f}s after the release"
    b.check_alive()
