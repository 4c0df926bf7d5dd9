"""Fleet-wide caps with two real supervisors on one database (SQLite file, and PostgreSQL).

Each supervisor runs two workers of an ``io`` pool with ``max_inflight = 3`` and
``tenant_max_inflight = 1``: four workers, room for three jobs. A big tenant's backlog is
enqueued first, then three other tenants' few jobs. The handlers' execution log (one line per
run, with its start and end) shows:

- never more than 3 jobs of the pool running at once, and never more than 1 of a tenant;
- the cap reached (3 at once) and both supervisors running jobs;
- the small tenant's jobs all finished while the big tenant still had most of its backlog
  waiting.

A handler's [start, end] lies inside the job's lease, so overlapping runs in the log are
overlapping leases.
"""

from __future__ import annotations

import pytest

from supervisor.model import JobState
from supervisor.store.budget import DEFERRED
from tests.integration.fleet import Harness, handlers
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

BIG = 30
SERVICE = 0.25


def most_at_once(runs: list[dict]) -> int:
    """The most runs open at one moment (an end before a start at the same instant)."""
    events = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    best = level = 0
    for _, step in events:
        level += step
        best = max(best, level)
    return best


def test_two_supervisors_share_the_pool_and_tenant_caps_fairly(fleet: Harness) -> None:
    fleet.configure(
        {
            "io": {
                "handlers": handlers("sleep"),
                "bound": "io",
                # two each: the cap of 3 can only be reached with both supervisors running jobs
                # (with three each, one node that re-claims at once after every result could
                # legitimately hold the whole cap by itself)
                "min_workers": 2,
                "max_workers": 2,
                "max_inflight": 3,
                "tenant_max_inflight": 1,
            }
        }
    )
    a, b = fleet.start("node-a"), fleet.start("node-b")
    for sup in (a, b):
        sup.wait_workers(fleet.store, "io", 2)

    job = {"seconds": SERVICE}
    big = [fleet.enqueue("sleep", job, tenant="big") for _ in range(BIG)]
    small = [fleet.enqueue("sleep", job, tenant="small") for _ in range(4)]
    others = [fleet.enqueue("sleep", job, tenant=t) for t in ("m1", "m2") for _ in range(6)]
    ids = big + small + others
    tenant_of = {i: t for t, group in (("big", big), ("small", small)) for i in group}
    tenant_of.update({i: fleet.job(i).tenant for i in others})

    jobs = fleet.wait_final(ids, timeout=90, watch=[a, b])
    assert all(j.state is JobState.DONE and j.attempts == 1 for j in jobs)

    runs = fleet.executions()
    assert sorted(r["job"] for r in runs) == sorted(ids), "each job ran exactly once"
    for r in runs:
        r["tenant"] = tenant_of[r["job"]]
    assert most_at_once(runs) <= 3, "more than max_inflight = 3 jobs ran at once"
    assert most_at_once(runs) == 3, "the cap was never reached: the test shows nothing"
    for tenant in ("big", "small", "m1", "m2"):
        mine = [r for r in runs if r["tenant"] == tenant]
        assert most_at_once(mine) == 1, f"tenant {tenant} ran more than one job at once"
    ran_on = {
        "a" if a.descendant(r["pid"]) else "b" if b.descendant(r["pid"]) else "?" for r in runs
    }
    assert ran_on == {"a", "b"}, "both supervisors ran jobs"

    small_done = max(r["end"] for r in runs if r["tenant"] == "small")
    big_waiting = sum(1 for r in runs if r["tenant"] == "big" and r["start"] > small_done)
    assert big_waiting >= BIG // 2, (
        f"the small tenant finished with only {big_waiting} of {BIG} big jobs still waiting"
    )


def test_past_the_retry_budget_failing_jobs_are_deferred_not_retried(fleet: Harness) -> None:
    """``retry_budget = "10%"`` with the default floor of 10 retries per 5-minute window: 15 jobs
    that always fail get 10 immediate retries between them; every later failure is deferred by
    the window; none is dropped or dead-lettered early."""
    fleet.configure(
        {
            "flaky": {
                "handlers": handlers("boom"),
                "bound": "io",
                "min_workers": 2,
                "max_workers": 2,
                "max_deliveries": 5,
                "retry_backoff": "50ms",
                "retry_backoff_max": "50ms",
                "retry_budget": "10%",
            }
        }
    )
    sup = fleet.start()
    ids = [fleet.enqueue("boom") for _ in range(15)]

    def all_deferred() -> list | None:
        sup.check_alive()
        jobs = fleet.jobs(ids)
        return jobs if all(j.last_error and DEFERRED in j.last_error for j in jobs) else None

    jobs = eventually(all_deferred, timeout=30)
    now = fleet.store.now()
    assert all(j.state is JobState.QUEUED for j in jobs), "never dropped, never dead yet"
    assert all(j.available_at > now + 250 for j in jobs), "deferred by the 5-minute window"
    # 15 first deliveries and exactly 10 immediate retries (which jobs got them varies)
    assert sum(j.attempts for j in jobs) == 25 and len(fleet.executions()) == 25
    assert "retry budget exhausted" in sup.log()
