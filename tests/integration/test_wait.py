"""Waiting on a result without polling, with real supervisors, on SQLite and PostgreSQL (issue
15, item 5): ``Client.wait`` is woken when its job becomes final, whoever makes it final.

Each wait here is given a safety-net poll of a minute (``poll=``): a wait that returns within
seconds of its job's end was woken, not polled. The one test of polling loses its wake-up for
real (SQLite: its socket removed from the folder, as a tmp cleaner would; PostgreSQL: its
connection stops listening) and polls every second.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.client import Client
from supervisor.model import Job, JobState
from supervisor.store.finals import FINAL_CHANNEL
from tests.integration.fleet import Harness, Supervisor, handlers

pytestmark = pytest.mark.slow

NOT_POLLED = 60.0  # the safety-net poll these waits get: far longer than any of them takes
WOKEN_WITHIN = 10.0  # bound on job end -> wait returned under load; a poll would be 60 s


def pool() -> dict[str, object]:
    return {
        "handlers": handlers("sleep", "echo", "permanent", "until_cancelled"),
        "min_workers": 2,
        "max_workers": 2,
        "prefetch": 0,
        "lease": "6s",
    }


def started(fleet: Harness) -> tuple[Supervisor, Client]:
    fleet.configure({"work": pool()})
    sup = fleet.start()
    sup.wait_workers(fleet.store, "work", 2)
    assert fleet.client is not None
    return sup, fleet.client


def woken(wait: Callable[[], Job]) -> Job:
    """Run ``wait``; assert it returned soon after the job's end (a wall-clock time the
    store wrote on this host), far sooner than its safety-net poll."""
    job = wait()
    returned = time.time()
    assert job.finished_at is not None
    late = returned - job.finished_at
    print(f"job {job.id} {job.state}: wait returned {late * 1000:.1f} ms after it ended")
    assert late < WOKEN_WITHIN, f"returned {late:.1f}s after the job ended: polled?"
    return job


def test_wait_returns_done_dead_and_cancelled_jobs_when_they_end(fleet: Harness) -> None:
    sup, client = started(fleet)
    # begun before the job is even claimed (it is due in 1 s), woken by the ack
    later = fleet.enqueue("echo", {"x": 1}, delay="1s")
    done = woken(lambda: client.wait(later, timeout=30, poll=NOT_POLLED))
    assert done.state is JobState.DONE and done.result["x"] == 1
    assert done.started_at is not None and done.started_at >= done.enqueued_at + 1.0

    dead = fleet.enqueue("permanent")  # a failure that dead-letters at once
    job = woken(lambda: client.wait(dead, timeout=30, poll=NOT_POLLED))
    assert job.state is JobState.DEAD and job.error_kind == "permanent"

    running = fleet.enqueue("sleep", {"seconds": 1000})
    fleet.wait_state([running], JobState.LEASED)
    queued = fleet.enqueue("sleep", {"seconds": 0}, delay="60s")
    runner = CliRunner()
    # a wait on both, then both cancelled from another process: a queued job at once (the
    # cancel's own transaction), a running one when its supervisor has stopped it
    out = runner.invoke(main, ["cancel", "-c", str(fleet.config), "--no-wait", str(queued)])
    assert out.exit_code == 0, out.output
    jobs = client.wait_all([running, queued], timeout=0.2, partial=True)
    assert [j.state for j in jobs] == [JobState.LEASED, JobState.CANCELLED]
    assert client.cancel(running) is True
    (stopped,) = [woken(lambda: client.wait(running, timeout=30, poll=NOT_POLLED))]
    assert stopped.state is JobState.CANCELLED
    sup.check_alive()


def test_a_wait_on_a_second_long_job_is_woken_by_its_ack(fleet: Harness) -> None:
    _, client = started(fleet)
    start = time.monotonic()
    job_id = fleet.enqueue("sleep", {"seconds": 1.0})
    job = woken(lambda: client.wait(job_id, timeout=30, poll=NOT_POLLED))
    assert job.state is JobState.DONE and time.monotonic() - start >= 1.0


def test_wait_all_is_woken_for_each_job(fleet: Harness) -> None:
    _, client = started(fleet)
    ids = [fleet.enqueue("sleep", {"seconds": s}) for s in (0.1, 0.6)]
    jobs = client.wait_all(ids, timeout=30, poll=NOT_POLLED)
    returned = time.time()
    assert [j.state for j in jobs] == [JobState.DONE, JobState.DONE]
    assert returned - max(j.finished_at or 0 for j in jobs) < WOKEN_WITHIN


def test_a_lost_wake_up_still_returns_by_polling(
    fleet: Harness, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = started(fleet)
    register = client.store.final_watch

    def deaf(**bounds: float) -> object:
        watch = register(**bounds)
        assert watch is not None  # the wake-up channel works; it is then lost
        if engine == "sqlite":
            os.unlink(watch.path)  # the announcer cannot find it: its datagrams go nowhere
        else:
            watch.conn.execute(f"UNLISTEN {FINAL_CHANNEL}")
        return watch

    monkeypatch.setattr(client.store, "final_watch", deaf)
    start = time.monotonic()
    job_id = fleet.enqueue("sleep", {"seconds": 0.2})
    job = client.wait(job_id, timeout=30, poll=1.0)
    took = time.monotonic() - start
    assert job.state is JobState.DONE
    assert took >= 0.9, f"returned after {took:.2f}s: it cannot have been woken"


def test_a_missing_job_is_a_clear_error(fleet: Harness) -> None:
    from supervisor.errors import JobNotFound

    _, client = started(fleet)
    with pytest.raises(JobNotFound, match="no job with id 999999"):
        client.wait(999999, timeout=1)


def test_enqueue_wait_prints_the_result_or_why_not(fleet: Harness) -> None:
    started(fleet)
    runner = CliRunner()
    config = str(fleet.config)
    out = runner.invoke(main, ["enqueue", "-c", config, "--wait", "echo", '{"n": 5}'])
    assert out.exit_code == 0, out.output
    job_id, result = out.output.splitlines()
    assert json.loads(result)["n"] == 5 and fleet.job(int(job_id)).state is JobState.DONE

    out = runner.invoke(main, ["enqueue", "-c", config, "--wait", "permanent"])
    assert out.exit_code == 1
    assert "ended dead (permanent)" in out.stderr

    out = runner.invoke(
        main,
        ["enqueue", "-c", config, "--wait", "--timeout", "300ms", "sleep", '{"seconds": 5}'],
    )
    assert out.exit_code == 1
    assert "after 0.3s (it goes on" in out.stderr

    out = runner.invoke(main, ["enqueue", "-c", config, "--timeout", "1s", "echo"])
    assert out.exit_code == 2 and "--timeout goes with --wait" in out.output
