"""A fresh worker per job (``max_jobs_per_worker = 1``) at fork speed, on both engines: the
pool keeps a booted spare beside its target (it fits under the ceiling), so a job starts on a
worker that was already Ready, never on one forked for it; no more than the target run at
once; and every job still gets a worker of its own."""

from __future__ import annotations

import itertools

from tests.integration.fleet import Harness, handlers
from tests.support.wait import eventually


def test_a_spare_is_kept_booted_and_jobs_never_wait_for_a_fork(fleet: Harness) -> None:
    fleet.configure(
        {
            "fresh": {
                "handlers": handlers("echo", "sleep"),
                "bound": "io",
                "min_workers": 1,
                "max_workers": 3,
                "max_jobs_per_worker": 1,
                "latency_target": "1h",  # the scaler keeps the target at min_workers
                "pipeline": 1,
            }
        }
    )
    sup = fleet.start()
    sup.wait_workers(fleet.store, "fresh", 2)  # the target (1) and its spare
    for n in range(4):
        ready = {w["pid"] for w in sup.workers(fleet.store, "fresh") if w["state"] == "idle"}
        assert len(ready) == 2
        (job,) = fleet.wait_final([fleet.enqueue("echo", {"n": n})], watch=[sup])
        (run,) = fleet.executions(job.id)
        assert run["pid"] in ready, "the job waited for a fork"
        # the worker retired after its job; a new spare is booted in its place
        eventually(
            lambda pid=run["pid"]: (
                sum(
                    w["state"] == "idle" and w["pid"] != pid
                    for w in sup.workers(fleet.store, "fresh")
                )
                == 2
            ),
            timeout=10,
        )
    pids = [r["pid"] for r in fleet.executions()]
    assert len(set(pids)) == len(pids) == 4  # a fresh worker per job
    # a backlog: the spare does not run a second job beside the target's one
    ids = [fleet.enqueue("sleep", {"seconds": 0.3}) for _ in range(3)]
    fleet.wait_final(ids, watch=[sup])
    runs = sorted((r["start"], r["end"]) for r in fleet.executions() if r["kind"] == "sleep")
    assert len(runs) == 3
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(runs)), runs
