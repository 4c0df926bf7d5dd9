"""Pure: which jobs of a worker with slots are blamed, and which released, on each kind of
worker end (``supervisor.run.exits.job_verdicts``), and the seed's sizing in workers."""

from __future__ import annotations

import signal

import pytest

from supervisor.model import ErrorKind
from supervisor.policy import KillKind, KillReason, PoolSizing, ceilings, desired_workers
from supervisor.run.exits import job_verdicts
from workers.limits import DEADLINE_SIGNAL

SIGKILLED = signal.SIGKILL  # a raw wait status: killed by SIGKILL
SEGV = signal.SIGSEGV
ALARM = int(DEADLINE_SIGNAL)
EXITED_1 = 1 << 8
RUNNING = {1: 10.0, 2: 20.0, 3: 30.0}  # job id -> deadline (monotonic)
NOW = 15.0


def kill(kind: KillKind, target: int | None = 1) -> tuple[KillReason, int | None]:
    return KillReason(kind, f"{kind} detail", target), target


# (status, kill, running, what each job gets: action/error_kind)
TABLE = [
    # a kill about one job: its kind for it, its siblings released (uncounted)
    (SIGKILLED, kill(KillKind.TIMEOUT), RUNNING, {1: "fail/timeout", 2: "release", 3: "release"}),
    (
        SIGKILLED,
        kill(KillKind.MEMORY_LIMIT, 2),
        RUNNING,
        {1: "release", 2: "fail/memory_limit", 3: "release"},
    ),
    (SIGKILLED, kill(KillKind.CANCEL, 3), RUNNING, {1: "release", 2: "release", 3: "cancel"}),
    (SIGKILLED, kill(KillKind.LEASE_LOST, 2), RUNNING, {1: "release", 2: "forget", 3: "release"}),
    # a drain, a retire: nobody to blame
    (SIGKILLED, kill(KillKind.DRAIN, 1), RUNNING, {1: "release", 2: "release", 3: "release"}),
    # a kill booked for a job that is not running any more: all released
    (SIGKILLED, kill(KillKind.TIMEOUT, 9), RUNNING, {1: "release", 2: "release", 3: "release"}),
    # the deadline alarm: the jobs past their deadline
    (ALARM, (None, None), RUNNING, {1: "fail/timeout", 2: "release", 3: "release"}),
    (ALARM, (None, None), {2: 20.0, 3: 30.0}, {2: "fail/timeout", 3: "release"}),
    # a crash with several jobs: none can be singled out, each is charged the delivery
    (SEGV, (None, None), RUNNING, {1: "fail/crashed", 2: "fail/crashed", 3: "fail/crashed"}),
    (EXITED_1, (None, None), {1: 10.0, 2: 20.0}, {1: "fail/crashed", 2: "fail/crashed"}),
    # one job: as a one-slot worker
    (SEGV, (None, None), {1: 10.0}, {1: "fail/crashed"}),
    (SIGKILLED, kill(KillKind.TIMEOUT), {1: 10.0}, {1: "fail/timeout"}),
    (SIGKILLED, (None, None), {}, {}),
]


@pytest.mark.parametrize(("status", "killed", "running", "expected"), TABLE)
def test_which_jobs_are_blamed(
    status: int,
    killed: tuple[KillReason | None, int | None],
    running: dict[int, float],
    expected: dict[int, str],
) -> None:
    reason, target = killed
    verdicts = job_verdicts(status, reason, target, running, NOW)
    got = {
        job: v.action + (f"/{v.error_kind}" if v.error_kind else "") for job, v in verdicts.items()
    }
    assert got == expected


def test_a_shared_crash_says_so() -> None:
    verdicts = job_verdicts(SEGV, None, None, RUNNING, NOW)
    assert all(v.error_kind is ErrorKind.CRASHED for v in verdicts.values())
    assert "running 3 jobs in its slots: none can be singled out" in verdicts[1].message


@pytest.mark.parametrize(
    ("slots", "per_worker", "workers"),
    [(48, 4, 12), (40, 20, 2), (41, 20, 3), (0, 20, 0), (500, 20, 25), (5, 1, 5)],
)
def test_desired_workers(slots: int, per_worker: int, workers: int) -> None:
    assert desired_workers(slots, per_worker) == workers


def test_ceilings_count_a_worker_with_slots_as_its_slots() -> None:
    mib = 1 << 20
    one = PoolSizing("one", "io", 0, 100, 20 * mib, max_inflight=50)
    many = PoolSizing("many", "io", 0, 100, 20 * mib, max_inflight=50, slots=20)
    got = ceilings([one, many], cores=2, memory_budget=1_000_000 * mib)
    assert (got["one"].value, got["one"].binding) == (50, "max_inflight")  # one job each
    assert (got["many"].value, got["many"].binding) == (3, "max_inflight")  # ceil(50 / 20)
    # until measured, a worker of 20 slots is planned at 20 jobs' peak
    assert got["many"].peak_per_job == 20 * got["one"].peak_per_job
