"""Pipelining: a pool of short jobs sends each worker several jobs ahead. Jobs queued in a
worker behind its running one were never started, so every way out hands them back unstarted
and uncounted: a drain (``Release``), a worker's death, a worker's recycle."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from supervisor.client import Client
from supervisor.model import ErrorKind, JobState
from supervisor.policy import pipeline_depth, recent_duration
from tests.integration.fleet import Harness, Supervisor, handlers
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

GRACE = 10.0


def quick_pool(**extra: Any) -> dict[str, dict[str, Any]]:
    """One worker that pipelines up to 8 jobs once it has seen short ones."""
    pool = {
        "handlers": handlers("noop", "sleep", "crash_exit", "gradual_bomb"),
        "min_workers": 1,
        "max_workers": 1,
        "pipeline": 8,
        "lease": "5s",
        "retry_backoff": "0.1s",
        "retry_backoff_max": "0.2s",
    }
    return {"quick": pool | extra}


def start_warm(
    fleet: Harness, pools: dict[str, dict[str, Any]], depth: int = 6, **fleet_keys: Any
) -> tuple[Supervisor, Client]:
    """Configure and start a fleet of ``pools``, then run short jobs until the pool pipelines
    at least ``depth`` jobs a worker. The pool's estimate jumps up at once on one slow job and
    decays 5 % a job: on a loaded machine one noop descheduled for 4 ms stops pipelining for
    ~40 jobs, so the warm-up folds the recorded durations the way the pool does (in finish
    order: one worker) and goes on until the estimate allows ``depth``."""
    fleet.configure(pools, **fleet_keys)
    sup = fleet.start("node-a")
    assert fleet.client is not None
    limit = next(iter(pools.values()))["pipeline"]
    estimate: float | None = None
    for _ in range(20):
        jobs = fleet.wait_final(fleet.client.enqueue_many([("noop", {}) for _ in range(20)]))
        for job in sorted(jobs, key=lambda j: (j.finished_at or 0.0, j.id)):
            assert job.duration is not None, job
            estimate = recent_duration(estimate, job.duration)
        if pipeline_depth(estimate, limit) >= depth:
            return sup, fleet.client
    raise AssertionError(f"the pool never measured its noops as short (estimate {estimate})")


def long_job_running(fleet: Harness, seconds: float, pools: dict[str, dict[str, Any]]) -> int:
    """Start a fleet of ``pools``, warm it up, and run one sleep job until it has run longer
    than a short job would (sendplan.QUEUE_BEHIND_AT_MOST, 50 ms); its id."""
    _, client = start_warm(fleet, pools)
    (slow,) = client.enqueue_many([("sleep", {"seconds": seconds})])
    fleet.wait_state([slow], JobState.LEASED)
    eventually(lambda: time.time() - (fleet.job(slow).started_at or time.time()) > 0.2)
    return slow


def test_a_drain_hands_back_the_jobs_queued_behind_a_running_one(fleet: Harness) -> None:
    a, client = start_warm(fleet, quick_pool(), grace_period=f"{GRACE}s")
    log = {"log": str(fleet.exec_log)}
    ids = client.enqueue_many(
        [("sleep", {"seconds": 3.0, **log})] + [("noop", log) for _ in range(5)]
    )
    slow, queued = ids[0], ids[1:]
    # one worker, no prefetch: all six leased means the five were sent behind the sleep
    fleet.wait_state(ids, JobState.LEASED)
    a.wait_workers(fleet.store, "quick", 1, "busy")

    start = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.wait_exit(timeout=GRACE + 5) == 0
    took = time.monotonic() - start
    # the worker ended its job, returned the five unstarted, and was stopped at once: the
    # drain did not sit out its grace period
    assert took < GRACE, f"exited {took:.2f}s after SIGTERM (grace {GRACE}s)"
    assert fleet.job(slow).state is JobState.DONE
    for job in fleet.jobs(queued):
        assert job.state is JobState.QUEUED and job.attempts == 0, job
        assert job.owner is None and job.locked_until is None, job
    assert not [r for r in fleet.executions() if r["job"] in queued]  # none of them ran


def test_jobs_queued_behind_one_that_crashes_run_once_elsewhere(fleet: Harness) -> None:
    _, client = start_warm(fleet, quick_pool(max_deliveries=1))
    log = {"log": str(fleet.exec_log)}
    ids = client.enqueue_many(
        [("crash_exit", {"code": 3, **log})] + [("noop", log) for _ in range(5)]
    )
    jobs = fleet.wait_final(ids)
    crashed, rest = jobs[0], jobs[1:]
    assert crashed.state is JobState.DEAD and crashed.error_kind is ErrorKind.CRASHED
    assert crashed.attempts == 1
    for job in rest:  # released by the worker's death, not counted, then run once
        assert job.state is JobState.DONE and job.attempts == 1, job
        assert len(fleet.executions(job.id)) == 1


def test_a_recycling_worker_is_sent_nothing_past_its_last_job(fleet: Harness) -> None:
    _, client = start_warm(fleet, quick_pool(max_jobs_per_worker=3))
    log = {"log": str(fleet.exec_log)}
    ids = client.enqueue_many([("noop", log) for _ in range(30)])
    jobs = fleet.wait_final(ids)
    assert all(j.state is JobState.DONE and j.attempts == 1 for j in jobs)
    runs = fleet.executions()
    assert sorted(r["job"] for r in runs) == sorted(ids)  # each exactly once
    assert len({r["pid"] for r in runs}) >= 10  # three jobs a worker


def test_a_memory_bomb_in_a_pipeline_is_the_job_that_fails(fleet: Harness) -> None:
    # the watchdog reads the worker's RSS, and the parent may not have read the result of the
    # job before the bomb yet: those frames are read before the kill is judged, so the bomb,
    # not its predecessor, ends memory_limit
    _, client = start_warm(fleet, quick_pool(memory_limit="256MiB", max_deliveries=1))
    log = {"log": str(fleet.exec_log)}
    ids = client.enqueue_many(
        [("noop", log) for _ in range(3)]
        + [("gradual_bomb", {"chunk_mib": 50, "interval": 0.02, **log})]
        + [("noop", log) for _ in range(3)]
    )
    jobs = fleet.wait_final(ids)
    bomb = jobs[3]
    assert bomb.state is JobState.DEAD and bomb.error_kind is ErrorKind.MEMORY_LIMIT, bomb
    for job in jobs[:3] + jobs[4:]:
        assert job.state is JobState.DONE and job.attempts == 1, job
        assert len(fleet.executions(job.id)) == 1


def test_short_jobs_are_not_queued_behind_a_job_that_runs_long(fleet: Harness) -> None:
    slow = long_job_running(fleet, 3.0, quick_pool(min_workers=2, max_workers=2))
    assert fleet.client is not None
    # its worker may have room by count, but the running job is past the pipeline's budget:
    # the short jobs go to the other worker and are done while it still runs
    quick = fleet.wait_final(fleet.client.enqueue_many([("noop", {}) for _ in range(20)]))
    assert fleet.job(slow).state is JobState.LEASED
    assert all(j.state is JobState.DONE for j in quick)


def test_nothing_is_claimed_for_a_worker_busy_with_a_long_job(fleet: Harness) -> None:
    # a pool that pipelines claims ahead for its workers' room; room behind a long job is not
    # room: those jobs would sit leased (out of other hosts' reach) until it ends
    slow = long_job_running(fleet, 2.0, quick_pool())
    assert fleet.client is not None
    quick = fleet.wait_final(fleet.client.enqueue_many([("noop", {}) for _ in range(10)]))
    done = fleet.job(slow).finished_at
    assert done is not None
    for job in quick:  # leased only once the worker was free again
        assert job.started_at is not None and job.started_at > done - 0.5, (job, done)
