"""Jobs that hang, crash or fail: each ends with the error kind and the sentence an operator
needs, the pool carries on, and retries follow the backoff."""

from __future__ import annotations

import itertools

import pytest

from supervisor.model import ErrorKind, JobState
from supervisor.policy import backoff_cap
from tests.integration.fleet import Harness, alive, handlers

pytestmark = pytest.mark.slow

TIMEOUT = 1.0
RETRY_BACKOFF = 0.3
# A retry becomes claimable after its backoff and the pool polls for it then (not at its idle
# poll's next tick, up to 1 s away): a loop pass, a claim and the hand-over to a worker.
SLACK = 0.15

POOLS = {
    "poison": {
        "handlers": handlers("hang", "crash_exit", "segfault", "echo"),
        "min_workers": 2,
        "max_workers": 2,
        "timeout": f"{TIMEOUT}s",
        "max_deliveries": 1,
    },
    "flaky": {
        "handlers": handlers("fail_until"),
        "min_workers": 1,
        "max_workers": 1,
        "max_deliveries": 3,
        "retry_backoff": f"{RETRY_BACKOFF}s",
        "retry_backoff_max": "10s",
    },
}


def test_a_hang_is_killed_within_timeout_plus_one_second(fleet: Harness) -> None:
    fleet.configure(POOLS)
    sup = fleet.start()
    job_id = fleet.enqueue("hang", {})
    (job,) = fleet.wait_final([job_id], timeout=15, watch=[sup])

    assert job.state == JobState.DEAD and job.error_kind == ErrorKind.TIMEOUT, job
    assert "timeout" in (job.last_error or ""), job.last_error
    assert job.started_at is not None and job.finished_at is not None
    # claimed -> failure recorded, on the store's clock (claim is before the job starts)
    assert TIMEOUT <= job.finished_at - job.started_at <= TIMEOUT + 1.0, job
    (run,) = fleet.executions(job_id)  # the handler's own start, on the worker's clock
    assert job.finished_at - run["start"] <= TIMEOUT + 1.0
    worker = sup.descendant(run["pid"])
    assert worker is not None and not alive(worker)  # the hung worker is gone
    # the pool carries on with a fresh worker
    after = fleet.enqueue("echo", {"after": "hang"})
    (done,) = fleet.wait_final([after], watch=[sup])
    assert done.state == JobState.DONE and done.result["after"] == "hang"


@pytest.mark.parametrize(
    ("kind", "payload", "said"),
    [
        ("crash_exit", {"code": 3}, "exited with code 3"),
        ("segfault", {}, "killed by SIGSEGV"),
    ],
)
def test_a_worker_that_dies_mid_job_is_a_crash(
    fleet: Harness, kind: str, payload: dict, said: str
) -> None:
    fleet.configure(POOLS)
    sup = fleet.start()
    job_id = fleet.enqueue(kind, payload)
    (job,) = fleet.wait_final([job_id], timeout=15, watch=[sup])

    assert job.state == JobState.DEAD and job.attempts == 1, job
    assert job.error_kind == ErrorKind.CRASHED, job
    assert said in (job.last_error or ""), job.last_error
    after = fleet.enqueue("echo", {"after": kind})
    (done,) = fleet.wait_final([after], watch=[sup])
    assert done.state == JobState.DONE and done.result["after"] == kind


def test_a_flaky_job_is_retried_with_backoff_and_ends_done(fleet: Harness) -> None:
    fleet.configure(POOLS)
    sup = fleet.start()
    job_id = fleet.enqueue("fail_until", {"succeed_on": 3})
    (job,) = fleet.wait_final([job_id], timeout=15, watch=[sup])

    assert job.state == JobState.DONE and job.attempts == 3, job
    assert job.result == {"attempt": 3}
    runs = sorted(fleet.executions(job_id), key=lambda r: r["start"])
    assert [(r["attempt"], r["outcome"]) for r in runs] == [(1, "raised"), (2, "raised"), (3, "ok")]
    gaps = [after["start"] - before["end"] for before, after in itertools.pairwise(runs)]
    for attempt, gap in enumerate(gaps, start=1):
        # full jitter: anywhere from 0 up to retry_backoff * 2**(attempt - 1)
        assert 0 <= gap <= backoff_cap(attempt, RETRY_BACKOFF, 10.0) + SLACK, gaps


def test_a_soft_timeout_lets_the_handler_clean_up_and_the_worker_lives_on(
    fleet: Harness, tmp_path
) -> None:
    pools = {
        "soft": {
            "handlers": handlers("hang_with_cleanup", "echo"),
            "min_workers": 1,
            "max_workers": 1,
            "timeout": "1s",
            "soft_timeout": "2s",
            "max_deliveries": 1,
        }
    }
    fleet.configure(pools)
    sup = fleet.start()
    marker = tmp_path / "cleaned"
    job_id = fleet.enqueue("hang_with_cleanup", {"cleanup": str(marker)})
    (job,) = fleet.wait_final([job_id], timeout=15, watch=[sup])
    assert job.state == JobState.DEAD and job.error_kind == ErrorKind.TIMEOUT, job
    assert "SoftTimeout" in (job.last_error or "") and "1s" in (job.last_error or "")
    assert job.finished_at is not None and job.started_at is not None
    assert job.finished_at - job.started_at < 1.0 + 1.0  # the handler stopped, no SIGKILL wait
    (run,) = fleet.executions(job_id)
    assert marker.read_text() == str(run["pid"])  # its finally block ran, in that worker
    after = fleet.enqueue("echo", {"n": 1})
    (done,) = fleet.wait_final([after], watch=[sup])
    assert done.state == JobState.DONE
    assert fleet.executions(after)[0]["pid"] == run["pid"]  # same worker: not killed


def test_a_hang_the_supervisor_cannot_kill_ends_by_its_workers_own_alarm(fleet: Harness) -> None:
    """The kernel's backstop: with the supervisor's timeout kill made to fail (a test seam,
    tests/support/hooked_start.py ``--no-kill timeout``), the worker's own deadline alarm ends
    it at timeout + soft window + 3 s (without it the hang would run forever), and the job
    fails as timeout."""
    fleet.configure(POOLS)
    sup = fleet.start(hooks=["--no-kill", "timeout"])
    job_id = fleet.enqueue("hang", {})
    (job,) = fleet.wait_final([job_id], timeout=20, watch=[sup])

    assert job.state == JobState.DEAD and job.error_kind == ErrorKind.TIMEOUT, job
    (run,) = fleet.executions(job_id)
    assert job.finished_at is not None
    # the alarm is armed just before the handler records its start (a few ms later on a
    # loaded host), so the end is measured from the start with that much slack below
    assert TIMEOUT + 3.0 - 0.1 <= job.finished_at - run["start"] <= TIMEOUT + 3.0 + 1.0, job
