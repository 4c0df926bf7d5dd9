"""Fair share between tenants in a plain pool (no caps), with real supervisors and workers, on
a SQLite file and on PostgreSQL.

- A big tenant's 40 jobs enqueued before a small tenant's 3, two workers: the small tenant's
  jobs all finish before the big tenant's 20th (plain priority-then-FIFO would run them last).
- ``fair = false``: they run last, in FIFO order.
- ``tenant_weights = { big = 3 }``, eight workers, both tenants with backlog: at every start
  the running jobs split 3 to 1 within one job (6 and 2 when all eight run).

The handlers' execution log (one line per run, with its start and end) is the record.
"""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.model import JobState
from tests.integration.fleet import Harness, handlers

pytestmark = pytest.mark.slow

SERVICE = 0.1


def plain_pool(workers: int, **keys: Any) -> dict[str, dict[str, Any]]:
    return {
        "io": {
            "handlers": handlers("sleep"),
            "bound": "io",
            "min_workers": workers,
            "max_workers": workers,
            **keys,
        }
    }


def run_batches(fleet: Harness, workers: int, batches: list[list[tuple[str, float]]]) -> list[dict]:
    """Start a supervisor, wait for its idle workers, enqueue each batch of (tenant, seconds)
    jobs in its own transaction, in order; wait for every job to be done. The runs, each with
    its tenant."""
    sup = fleet.start()
    sup.wait_workers(fleet.store, "io", workers)
    assert fleet.client is not None
    tenant_of: dict[int, str] = {}
    for batch in batches:
        items = [
            {
                "kind": "sleep",
                "payload": {"seconds": t, "log": str(fleet.exec_log)},
                "tenant": tenant,
            }
            for tenant, t in batch
        ]
        ids = fleet.client.enqueue_many(items)
        tenant_of.update(zip(ids, (tenant for tenant, _ in batch), strict=True))
    jobs = fleet.wait_final(list(tenant_of), timeout=120, watch=[sup])
    assert all(j.state is JobState.DONE and j.attempts == 1 for j in jobs)
    runs = fleet.executions()
    assert sorted(r["job"] for r in runs) == sorted(tenant_of), "each job ran exactly once"
    for r in runs:
        r["tenant"] = tenant_of[r["job"]]
    return runs


def times(runs: list[dict], tenant: str, what: str) -> list[float]:
    return sorted(r[what] for r in runs if r["tenant"] == tenant)


def test_a_small_tenant_is_not_held_back_by_a_big_backlog(fleet: Harness) -> None:
    fleet.configure(plain_pool(2))
    runs = run_batches(fleet, 2, [[("big", SERVICE)] * 40, [("small", SERVICE)] * 3])
    big_ends = times(runs, "big", "end")
    assert max(times(runs, "small", "end")) < big_ends[19], (
        "the small tenant's jobs did not all finish before the big tenant's 20th"
    )


def test_fair_false_keeps_priority_then_fifo(fleet: Harness) -> None:
    fleet.configure(plain_pool(2, fair=False))
    runs = run_batches(fleet, 2, [[("big", SERVICE)] * 40, [("small", SERVICE)] * 3])
    # claims are FIFO and one at a time: the small tenant's jobs are the 41st to 43rd claimed
    assert min(times(runs, "small", "start")) > times(runs, "big", "start")[37]


def running_at(runs: list[dict], t: float) -> dict[str, int]:
    """Runs open just after instant ``t`` (a run that ended at ``t`` is over)."""
    open_ = [r for r in runs if r["start"] <= t < r["end"]]
    return {tenant: sum(r["tenant"] == tenant for r in open_) for tenant in ("big", "small")}


def test_weights_split_the_running_jobs(fleet: Harness) -> None:
    """Durations of 0.2 to 0.4 s (spread evenly, so the workers do not all end together);
    both tenants' jobs in one transaction, so the first claim sees both."""
    fleet.configure(plain_pool(8, tenant_weights={"big": 3}))
    jobs = [("big", 0.2 + (i % 9) / 40) for i in range(48)]
    jobs += [("small", 0.2 + (i % 7) / 30) for i in range(16)]
    runs = run_batches(fleet, 8, [jobs])
    # while both have jobs waiting: until the last start of the first tenant to run out
    backlog_until = min(times(runs, "big", "start")[-1], times(runs, "small", "start")[-1])
    full = 0
    for start in sorted(r["start"] for r in runs if r["start"] < backlog_until):
        running = running_at(runs, start)
        if running["big"] + running["small"] < 8:
            continue  # workers between jobs: the claims that fill them are on their way
        full += 1
        assert abs(running["big"] - 6) <= 1 and abs(running["small"] - 2) <= 1, (
            f"with all 8 workers busy, {running}: not within one job of 6 and 2"
        )
    assert full >= 10, f"the pool was full at only {full} starts: the test shows little"
