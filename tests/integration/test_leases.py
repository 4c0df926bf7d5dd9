"""Never run a job whose lease you do not hold: a job whose lease is taken over (made to expire
and re-claimed by a "thief" from the test) gets its worker killed, and a worker's result that
arrives after the takeover changes nothing: the job's result is the thief's."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import update

from supervisor.model import Ack, Claimed, JobState
from supervisor.store import Store
from supervisor.store.schema import jobs
from tests.integration.fleet import Harness, handlers, wait_gone
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

THIEF = "thief"


def steal(store: Store, job_id: int, pool: str, kind: str) -> Claimed:
    """Expire the job's lease, reap it and claim it as another node. Retried until the claim
    wins: the supervisor's heartbeat may extend the lease between our update and the reap."""

    def attempt() -> Claimed | None:
        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == "leased")
                .values(locked_until=0.0)
            )
        store.reap()
        got = store.claim(pool=pool, kinds={kind}, n=1, node=THIEF, lease=60.0)
        return next((c for c in got if c.job_id == job_id), None)

    return eventually(attempt, timeout=5)


def running_on(fleet: Harness, job_id: int, node: str) -> bool:
    job = fleet.job(job_id)
    return job.state == JobState.LEASED and job.owner == node


def test_a_job_whose_lease_is_taken_over_is_killed(fleet: Harness) -> None:
    # lease 1 s: the heartbeat (every 1/3 s) finds the takeover quickly
    pools = {"work": {"handlers": handlers("sleep"), "min_workers": 1, "max_workers": 1}}
    pools["work"]["lease"] = "1s"
    fleet.configure(pools)
    sup = fleet.start()
    job_id = fleet.enqueue("sleep", {"seconds": 30})
    eventually(lambda: running_on(fleet, job_id, "node-a"))
    sup.wait_workers(fleet.store, "work", 1, "busy")
    (worker,) = sup.worker_processes()

    stolen = steal(fleet.store, job_id, "work", "sleep")
    assert stolen.attempt == 2
    took = wait_gone([worker], timeout=3.0)
    assert took < 1.5, f"the worker ran {took:.2f}s on a lease it no longer held"
    eventually(lambda: "its lease was taken over" in sup.log(), timeout=2)
    assert not fleet.executions(job_id)  # it never finished

    # the thief's result is the job's result; the supervisor did not touch the job meanwhile
    job = fleet.job(job_id)
    assert job.state == JobState.LEASED and job.owner == THIEF, job
    assert fleet.store.ack([Ack(stolen.lease, json.dumps("thief's result"))]) == []
    job = fleet.job(job_id)
    assert job.state == JobState.DONE and job.result == "thief's result", job
    sup.check_alive()


def test_a_late_ack_from_a_worker_that_lost_its_lease_changes_nothing(fleet: Harness) -> None:
    # No heartbeat during the test (lease 30 s, heartbeat 20 s): the worker is not killed, it
    # finishes and its ack arrives after the takeover.
    pools = {"work": {"handlers": handlers("sleep"), "min_workers": 1, "max_workers": 1}}
    pools["work"].update(lease="30s", heartbeat="20s")
    fleet.configure(pools)
    sup = fleet.start()
    job_id = fleet.enqueue("sleep", {"seconds": 1.5})
    eventually(lambda: running_on(fleet, job_id, "node-a"))

    stolen = steal(fleet.store, job_id, "work", "sleep")
    stolen_at = time.time()
    (run,) = eventually(lambda: fleet.executions(job_id), timeout=10)
    assert run["outcome"] == "ok" and run["end"] > stolen_at  # the worker's result came late
    # wait until the supervisor has written its results after that run: it publishes its
    # node row after flushing, in the same loop pass
    eventually(lambda: sup.node(fleet.store)["heartbeat_at"] > run["end"] + 0.05, timeout=5)
    sup.wait_workers(fleet.store, "work", 1, "idle")

    job = fleet.job(job_id)
    assert job.state == JobState.LEASED and job.owner == THIEF, job
    assert job.result is None and job.attempts == 2, job
    assert fleet.store.ack([Ack(stolen.lease, json.dumps("thief's result"))]) == []
    job = fleet.job(job_id)
    assert job.state == JobState.DONE and job.result == "thief's result", job
    sup.check_alive()
