"""Pools with slots, with real supervisors on SQLite and PostgreSQL (issue 16's "Show"):

- ``slots = 20``, ``max_workers = 2``: 200 jobs of a 1 s sleep done in under 7 s by exactly
  two worker processes (the pids the handlers saw);
- a job past its deadline in a slot ends ``timeout``; its siblings are released uncounted
  (attempts back to what they were) and end done on the worker that replaces it;
- the same for a cancel (``Client.cancel``) and for a memory kill;
- ``async def`` handlers run as tasks (one hung past its deadline is cancelled, the worker
  lives on; one that swallows the cancellation is killed);
- a drain with busy slots lets them finish within the grace, or releases them after it.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest

from supervisor.model import ErrorKind, JobState
from tests.integration.fleet import Harness, Supervisor, handlers
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

KINDS = ("slot_sleep", "async_sleep", "async_stubborn", "gradual_bomb", "slot_cancel_wait")


def pool(**keys: Any) -> dict[str, Any]:
    return {
        "handlers": handlers(*KINDS),
        "bound": "io",
        "min_workers": 1,
        "max_workers": 1,
        "slots": 4,
        "prefetch": 0,
        "lease": "6s",
        **keys,
    }


def pid_of(job: Any) -> int:
    result = json.loads(job.result) if isinstance(job.result, str) else job.result
    return int(result["pid"])


def the_worker(sup: Supervisor, fleet: Harness) -> int:
    """The pid of the pool's one worker, once it runs a job (from the snapshot)."""

    def busy() -> int | None:
        found = [w for w in sup.workers(fleet.store, "io") if w["job"] is not None]
        return int(found[0]["pid"]) if found else None

    return eventually(busy, timeout=10)


def test_200_one_second_jobs_on_two_workers_of_20_slots(fleet: Harness) -> None:
    fleet.configure({"io": pool(min_workers=2, max_workers=2, slots=20, timeout="30s")})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "io", 2)
    assert fleet.client is not None
    start = time.monotonic()
    ids = fleet.client.enqueue_many([("slot_sleep", {"seconds": 1.0}) for _ in range(200)])
    jobs = fleet.wait_final(ids, timeout=30, watch=[sup])
    took = time.monotonic() - start
    print(f"200 jobs of 1 s on 2 workers x 20 slots: {took:.2f} s")
    assert all(j.state is JobState.DONE and j.attempts == 1 for j in jobs)
    assert len({pid_of(j) for j in jobs}) == 2  # exactly two worker processes ran them
    assert took < 7.0, f"took {took:.2f}s (the bound is 7 s; 5 s is 10 rounds of 40)"


def siblings_released(fleet: Harness, victim: int, siblings: list[int]) -> None:
    """Each sibling ran to the end elsewhere, its delivery counted once (the release gave
    back the one the killed worker had taken)."""
    for job in fleet.wait_final(siblings, timeout=20):
        assert job.state is JobState.DONE, job
        assert job.attempts == 1, job
        assert pid_of(job) != victim, job


def test_a_slot_past_its_deadline_ends_its_worker_and_only_its_job(fleet: Harness) -> None:
    fleet.configure({"io": pool(timeout="2s", max_deliveries=1)})
    sup = fleet.start()
    hang = fleet.enqueue("slot_sleep", {"seconds": 30})
    victim = the_worker(sup, fleet)
    # the siblings start a second into the hang and need 1.5 s: the kill at 2 s finds them
    eventually(lambda: time.time() - (fleet.job(hang).started_at or time.time()) >= 0.8)
    siblings = [fleet.enqueue("slot_sleep", {"seconds": 1.5}) for _ in range(3)]
    fleet.wait_state(siblings, JobState.LEASED)
    (dead,) = fleet.wait_final([hang], timeout=15)
    assert dead.state is JobState.DEAD and dead.error_kind is ErrorKind.TIMEOUT, dead
    assert dead.attempts == 1
    siblings_released(fleet, victim, siblings)


def test_a_cancelled_slot_ends_its_worker_and_only_its_job(fleet: Harness) -> None:
    fleet.configure({"io": pool(timeout="60s")})
    sup = fleet.start()
    hang = fleet.enqueue("slot_sleep", {"seconds": 1000})
    siblings = [fleet.enqueue("slot_sleep", {"seconds": 2.0}) for _ in range(3)]
    fleet.wait_state([hang, *siblings], JobState.LEASED)
    victim = the_worker(sup, fleet)
    assert fleet.client is not None and fleet.client.cancel(hang)
    cancelled = eventually(lambda: (j := fleet.job(hang)).state is JobState.CANCELLED and j)
    assert cancelled.attempts == 1
    siblings_released(fleet, victim, siblings)


def test_a_memory_kill_in_a_slot_blames_the_job_that_grew(fleet: Harness) -> None:
    fleet.configure({"io": pool(timeout="60s", memory_limit="200MiB", max_deliveries=1)})
    sup = fleet.start()
    siblings = [fleet.enqueue("slot_sleep", {"seconds": 3.0}) for _ in range(3)]
    fleet.wait_state(siblings, JobState.LEASED)
    victim = the_worker(sup, fleet)
    bomb = fleet.enqueue("gradual_bomb", {"chunk_mib": 10, "interval": 0.02, "max_mib": 2048})
    (dead,) = fleet.wait_final([bomb], timeout=20)
    assert dead.state is JobState.DEAD and dead.error_kind is ErrorKind.MEMORY_LIMIT, dead
    for job in fleet.wait_final(siblings, timeout=20):
        assert job.state is JobState.DONE and job.attempts == 1, job
    if "stopped by the watchdog" in (dead.last_error or ""):  # not a MemoryError in its thread
        assert all(pid_of(j) != victim for j in fleet.jobs(siblings))


def test_async_handlers_run_as_tasks_and_are_cancelled_at_their_deadline(
    fleet: Harness,
) -> None:
    fleet.configure({"io": pool(slots=20, timeout="2s", max_deliveries=1)})
    sup = fleet.start()
    hung = fleet.enqueue("async_sleep", {"seconds": 30})
    ids = [fleet.enqueue("async_sleep", {"seconds": 1.0}) for _ in range(20)]
    jobs = fleet.wait_final(ids, timeout=20, watch=[sup])
    assert all(j.state is JobState.DONE for j in jobs)
    pids = {pid_of(j) for j in jobs}
    assert len(pids) == 1
    (timed_out,) = fleet.wait_final([hung], timeout=15)
    assert timed_out.error_kind is ErrorKind.TIMEOUT, timed_out
    assert "cancelled at the deadline" in (timed_out.last_error or ""), timed_out
    # its worker lived on: the next job runs in the same process
    (after,) = fleet.wait_final([fleet.enqueue("async_sleep", {"seconds": 0.1})])
    assert pid_of(after) in pids

    stubborn = fleet.enqueue("async_stubborn", {})
    (killed,) = fleet.wait_final([stubborn], timeout=15)
    assert killed.error_kind is ErrorKind.TIMEOUT, killed
    assert "cancelled at the deadline" not in (killed.last_error or "")


@pytest.mark.parametrize("finish", [True, False], ids=["within-grace", "past-grace"])
def test_a_drain_with_busy_slots(fleet: Harness, finish: bool) -> None:
    fleet.configure({"io": pool(timeout="60s")}, grace_period="5s" if finish else "0.5s")
    sup = fleet.start()
    seconds = 1.0 if finish else 30.0
    ids = [fleet.enqueue("slot_sleep", {"seconds": seconds}) for _ in range(4)]
    fleet.wait_state(ids, JobState.LEASED)
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(timeout=20) == 0
    for job in fleet.jobs(ids):
        if finish:
            assert job.state is JobState.DONE and job.attempts == 1, job
        else:
            assert job.state is JobState.QUEUED and job.attempts == 0, job


def test_a_cancelled_async_job_is_cancelled_cooperatively(fleet: Harness) -> None:
    fleet.configure({"io": pool(timeout="60s")})
    sup = fleet.start()
    hang = fleet.enqueue("async_sleep", {"seconds": 1000})
    sibling = fleet.enqueue("async_sleep", {"seconds": 2.0})
    fleet.wait_state([hang, sibling], JobState.LEASED)
    worker = the_worker(sup, fleet)
    assert fleet.client is not None and fleet.client.cancel(hang)
    cancelled = eventually(lambda: (j := fleet.job(hang)).state is JobState.CANCELLED and j)
    assert "task was cancelled" in (cancelled.last_error or ""), cancelled
    # its task was cancelled, not its worker killed: the sibling finished there, unreleased
    (done,) = fleet.wait_final([sibling])
    assert done.state is JobState.DONE and done.attempts == 1 and pid_of(done) == worker


def test_two_cancels_in_one_worker_each_reach_their_job(fleet: Harness) -> None:
    fleet.configure({"io": pool(timeout="60s")})
    fleet.start()
    ids = [fleet.enqueue("slot_cancel_wait", {"seconds": 30}) for _ in range(2)]
    fleet.wait_state(ids, JobState.LEASED)
    assert fleet.client is not None and all(fleet.client.cancel(i) for i in ids)

    # one CancelSlot per worker: the second cancel waits for the first, then is signalled
    def all_cancelled() -> list[Any] | None:
        jobs = fleet.jobs(ids)
        return jobs if all(j.state is JobState.CANCELLED for j in jobs) else None

    jobs = eventually(all_cancelled, timeout=10)
    for job in jobs:
        result = json.loads(job.result) if isinstance(job.result, str) else job.result
        assert result == {"stopped": True}, job  # it saw its own cancel, not the 30 s end


def test_many_slots_fit_under_the_default_memory_rlimit(fleet: Harness) -> None:
    """A thread's stack is private writable memory: RLIMIT_DATA (memory_limit + headroom)
    counts it as allocated. 100 slots are 800 MiB of stacks, past the 640 MiB a default
    memory_limit of 512 MiB gives: the worker must size its rlimit for its slots' stacks,
    else its 80th thread cannot start and the worker dies, charging every running job."""
    fleet.configure({"io": pool(slots=100, timeout="30s")})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "io", 1)
    assert fleet.client is not None
    ids = fleet.client.enqueue_many([("slot_sleep", {"seconds": 2.0}) for _ in range(100)])
    jobs = fleet.wait_final(ids, timeout=60, watch=[sup])
    assert all(j.state is JobState.DONE and j.attempts == 1 for j in jobs), [
        (j.id, j.state, j.attempts, j.error) for j in jobs if j.state is not JobState.DONE
    ][:3]
    assert len({pid_of(j) for j in jobs}) == 1  # one worker ran them all, none crashed


def test_a_recycling_worker_still_has_its_running_slots_watched(fleet: Harness) -> None:
    """A worker with slots that said Recycling (here: recycle_rss) exits only once its
    other slots are done; until then the watchdog still kills it at a slot's deadline (the
    worker's own deadline alarm is only the backstop, seconds later)."""
    fleet.configure({"io": pool(slots=2, timeout="2s", recycle_rss="1MiB", max_deliveries=1)})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "io", 1)
    assert fleet.client is not None
    hung = fleet.client.enqueue("slot_sleep", {"seconds": 60.0})
    the_worker(sup, fleet)
    quick = fleet.client.enqueue("slot_sleep", {"seconds": 0.1})
    done = fleet.wait_final([quick], timeout=20, watch=[sup])[0]
    assert done.state is JobState.DONE  # and its worker said Recycling: it is over 1 MiB
    job = fleet.wait_final([hung], timeout=30, watch=[sup])[0]
    assert job.error_kind is ErrorKind.TIMEOUT, job
    # the parent's kill, not the backstop
    assert "deadline alarm" not in (job.last_error or ""), job


def test_a_one_slot_pool_with_an_async_handler(fleet: Harness) -> None:
    """slots = 1 with an ``async def`` handler: the slot runtime with one slot, behind the
    pool's pipeline (short jobs are sent ahead). A hung job is cancelled at its deadline,
    the worker lives on, and the short jobs sent behind it run with their whole timeout."""
    fleet.configure({"io": pool(slots=1, timeout="2s", max_deliveries=1)})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "io", 1)
    assert fleet.client is not None
    warm = fleet.client.enqueue_many([("async_sleep", {"seconds": 0}) for _ in range(40)])
    jobs = fleet.wait_final(warm, timeout=30, watch=[sup])
    assert all(j.state is JobState.DONE for j in jobs)
    worker = pid_of(jobs[0])
    hung = fleet.client.enqueue("async_sleep", {"seconds": 60})
    after = fleet.client.enqueue_many([("async_sleep", {"seconds": 0}) for _ in range(5)])
    (timed_out,) = fleet.wait_final([hung], timeout=30, watch=[sup])
    assert timed_out.error_kind is ErrorKind.TIMEOUT, timed_out
    assert "task was cancelled" in (timed_out.last_error or ""), timed_out  # not killed
    for job in fleet.wait_final(after, timeout=30, watch=[sup]):
        assert job.state is JobState.DONE and job.attempts == 1, job
        assert pid_of(job) == worker, job
