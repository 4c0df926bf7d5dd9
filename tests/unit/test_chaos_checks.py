"""The chaos run's invariants catch what they claim to catch: each test fabricates the evidence
of a small run, clean or with one fault, and looks at the verdict (stress/chaos_checks.py)."""

from __future__ import annotations

from typing import Any

from stress.chaos_checks import (
    DbRestart,
    Evidence,
    LeaseEvent,
    LoggedFailure,
    NodeRun,
    PlannedJob,
    WorkerKill,
    check,
)
from supervisor.model import ErrorKind, Job, JobState

T0 = 1_000_000.0


def job(job_id: int, state: str = "done", attempts: int = 1, **kw: Any) -> Job:
    fields: dict[str, Any] = {
        "id": job_id,
        "kind": "ping",
        "pool": "interactive",
        "state": JobState(state),
        "attempts": attempts,
        "max_deliveries": 5,
        "payload": {},
        "tenant": None,
        "key": None,
        "priority": 0,
        "enqueued_at": T0,
        "available_at": T0,
        "started_at": T0 + 0.01,
        "finished_at": T0 + 0.02,
        "result": None,
        "last_error": None,
        "error_kind": None,
        "peak_rss": None,
        "duration": None,
        **kw,
    }
    return Job(**fields)


def ran(job_id: int, attempt: int = 1, pid: int = 500, ppid: int = 100, **kw: Any) -> dict:
    return {
        "job": job_id,
        "attempt": attempt,
        "pid": pid,
        "ppid": ppid,
        "kind": "ping",
        "start": T0 + 0.01,
        "end": T0 + 0.02,
        "outcome": "ok",
        **kw,
    }


def dead_hang(error_kind: ErrorKind, last_error: str, attempts: int = 3) -> Job:
    """Job 2, the hang, dead after ``attempts`` deliveries."""
    return job(
        2,
        "dead",
        attempts,
        kind="hang",
        pool="poison",
        error_kind=error_kind,
        last_error=last_error,
    )


def timeouts(n: int = 3) -> list[LoggedFailure]:
    """The hang's (job 2) logged failures, attempts 1..n."""
    return [
        LoggedFailure(T0 + a, "s1-1", 2, a, "timeout", "ran past its timeout")
        for a in range(1, n + 1)
    ]


def evidence(**kw: Any) -> Evidence:
    """A clean run: job 1 normal and done, job 2 a hang dead of timeout after 3 deliveries."""
    fields: dict[str, Any] = {
        "plan": {
            1: PlannedJob("ping", "interactive"),
            2: PlannedJob("hang", "poison", "timeout"),
        },
        "jobs": {
            1: job(1),
            2: dead_hang(ErrorKind.TIMEOUT, "ran past its timeout of 2s"),
        },
        "executions": [ran(1)],
        "nodes": [NodeRun("s1-1", "base", 100, T0 - 5)],
        "kills": [],
        "failures": timeouts(),
        "max_deliveries": {"interactive": 5, "poison": 3},
    }
    fields.update(kw)
    return Evidence(**fields)


def test_a_clean_run_has_no_violation() -> None:
    report = check(evidence())
    assert report.violations == []
    flat = report.flat()
    assert flat["jobs.lost"] == 0 and flat["poison.dead"] == 1 and flat["normal.done"] == 1


def test_a_lost_job_and_an_unfinished_one_are_violations() -> None:
    ev = evidence()
    del ev.jobs[1]
    ev.jobs[2] = job(2, "leased", 1, kind="hang", pool="poison")
    violations = check(ev).violations
    assert any("missing from the store: 1" in v for v in violations)
    assert any("not final" in v for v in violations)


def test_a_poison_job_of_the_wrong_kind_fails_unless_a_kill_explains_it() -> None:
    crashed = dead_hang(
        ErrorKind.CRASHED,
        "worker killed by SIGKILL (not by fleetd: the kernel's OOM killer or ...)",
    )
    failure = LoggedFailure(T0 + 1.0, "s1-1", 2, 3, "crashed", crashed.last_error or "")
    failures = [*timeouts(2), failure]
    unexplained = check(evidence(jobs={1: job(1), 2: crashed}, failures=failures))
    assert any("dead of crashed, expected timeout" in v for v in unexplained.violations)

    kill = WorkerKill(T0 + 0.9, "s1-1", 777, "poison", 2)
    explained = check(evidence(jobs={1: job(1), 2: crashed}, failures=failures, kills=[kill]))
    assert explained.violations == []
    assert "crashed (worker SIGKILLed by the harness) 1" in str(explained.flat())


def test_lease_expired_is_explained_only_under_a_sigkilled_supervisor() -> None:
    def expired(node: str) -> Job:
        return dead_hang(
            ErrorKind.LEASE_EXPIRED, f"the lease held by node {node} expired during attempt 3"
        )

    jobs, two = {1: job(1), 2: expired("s1-1")}, timeouts(2)  # the third delivery expired
    killed = NodeRun("s1-1", "base", 100, T0 - 5, signalled=T0, how="kill", held=(2,))
    assert check(evidence(jobs=jobs, failures=two, nodes=[killed])).violations == []

    drained = NodeRun("s1-1", "base", 100, T0 - 5, T0, "drain", T0 + 1, 0)
    violations = check(evidence(jobs=jobs, failures=two, nodes=[drained])).violations
    assert any("dead of lease_expired" in v for v in violations)
    assert any("waited out a lease of a drained supervisor" in v for v in violations)


def test_a_poison_job_dead_before_max_deliveries_is_a_violation() -> None:
    early = dead_hang(ErrorKind.TIMEOUT, "ran past its timeout of 2s", attempts=2)
    violations = check(evidence(jobs={1: job(1), 2: early}, failures=timeouts(2))).violations
    assert any("not max_deliveries 3" in v for v in violations)


def test_a_normal_job_failing_for_no_fault_is_a_violation() -> None:
    harmed = LoggedFailure(T0, "s1-1", 1, 1, "memory_limit", "worker RSS passed memory_limit")
    violations = check(
        evidence(
            jobs={1: job(1, attempts=2), 2: evidence().jobs[2]}, failures=[*timeouts(), harmed]
        )
    ).violations
    assert any(
        "normal job 1 (ping) attempt 1 on s1-1 failed: memory_limit" in v for v in violations
    )

    flaky_plan = {**evidence().plan, 1: PlannedJob("flaky", "bulk")}
    flaky = LoggedFailure(T0, "s1-1", 1, 1, "exception", "RuntimeError: flaky")
    flaked = {1: job(1, attempts=2), 2: evidence().jobs[2]}
    assert (
        check(evidence(plan=flaky_plan, jobs=flaked, failures=[*timeouts(), flaky])).violations
        == []
    )


def test_deliveries_that_ended_silently_need_a_killed_supervisor() -> None:
    again = {1: job(1, attempts=2), 2: evidence().jobs[2]}  # delivery 1 left no outcome
    violations = check(evidence(jobs=again)).violations
    assert any("1 deliveries ended with no outcome" in v for v in violations)
    killed = NodeRun("s1-1", "base", 100, T0 - 5, signalled=T0, how="kill", held=(1,))
    assert check(evidence(jobs=again, nodes=[killed])).violations == []


def test_duplicates_need_a_kill() -> None:
    twice = [ran(1, 1, pid=500), ran(1, 2, pid=501)]
    violations = check(evidence(executions=twice)).violations
    assert any("job 1 completed 2 times" in v for v in violations)

    kill = WorkerKill(T0 + 0.03, "s1-1", 500, "interactive", 1)
    report = check(evidence(executions=twice, kills=[kill]))
    assert report.violations == []
    assert report.flat()["duplicates.explained by a worker kill"] == 1

    killed = NodeRun("s1-1", "base", 100, T0 - 5, signalled=T0 + 0.05, how="kill")
    report = check(evidence(executions=twice, nodes=[killed]))
    assert report.violations == []
    assert report.flat()["duplicates.explained by a supervisor SIGKILL"] == 1


def test_a_drain_that_left_a_lease_and_a_cap_overrun_are_violations() -> None:
    drained = NodeRun("s1-1", "base", 100, T0 - 5, T0, "drain", T0 + 1, 0, left=(1,))
    assert any("still leased by s1-1" in v for v in check(evidence(nodes=[drained])).violations)

    calls = [
        ran(10 + n, pid=600 + n, kind="call", start=T0 + n * 0.01, end=T0 + 1, waited=0.0)
        for n in range(3)
    ]
    report = check(evidence(executions=calls, caps={"call": 2}))
    assert report.flat()["caps.call: most executions at once"] == 3
    assert any("over max_inflight 2" in v for v in report.violations)


def test_processes_left_behind_are_violations() -> None:
    report = check(evidence(leftovers=["pid 4242 'fleetd: poison#1' of s1-1"]))
    assert any("left behind: pid 4242" in v for v in report.violations)


def test_a_database_restart_explains_lost_and_expired_leases_only_near_it() -> None:
    # job 1's first delivery on s1-1 lost its lease (the worker killed), a reaper found it
    # expired, and delivery 2 completed it; s1-1 itself was stopped normally at the end
    expired = job(
        1,
        attempts=2,
        error_kind=ErrorKind.LEASE_EXPIRED,
        last_error="the lease held by node s1-1 expired during attempt 1",
    )
    stopped = NodeRun("s1-1", "base", 100, T0 - 5, T0 + 20, "stop", T0 + 21, 0)
    kw: dict[str, Any] = {
        "jobs": {1: expired, 2: evidence().jobs[2]},
        "nodes": [stopped],
        "lost_leases": [LeaseEvent(T0 + 3.0, "s1-1", 1)],
        "expired_leases": [LeaseEvent(T0 + 4.0, "s2-1", 1)],
    }
    violations = check(evidence(**kw)).violations
    assert any("a lease expired under s1-1, which was not SIGKILLed" in v for v in violations)
    assert any("waited out a lease of a drained supervisor" in v for v in violations)
    assert any("s1-1 lost the lease of job 1" in v for v in violations)

    long_before = [DbRestart(T0 - 60, T0 - 57.5, T0 - 59.9, T0 - 59.7)]
    assert len(check(evidence(**kw, db_restarts=long_before)).violations) == 3

    report = check(evidence(**kw, db_restarts=[DbRestart(T0, T0 + 2.5, T0 + 0.1, T0 + 0.3)]))
    assert report.violations == []
    flat = report.flat()
    assert flat["faults.database server restarts"] == 1
    assert flat["database.refusing connections (pg_isready), max / mean"] == "0.20s / 0.20s"
    assert flat["database.leases lost by a live supervisor near a restart"] == 1
    assert flat["database.leases expired under a live supervisor near a restart"] == 1


def test_a_database_restart_explains_a_poison_job_dead_of_an_expired_lease() -> None:
    hang = dead_hang(
        ErrorKind.LEASE_EXPIRED, "the lease held by node s1-1 expired during attempt 3"
    )
    kw: dict[str, Any] = {
        "jobs": {1: job(1), 2: hang},
        "failures": timeouts(2),
        "expired_leases": [LeaseEvent(T0 + 9.0, "s1-1", 2)],
    }
    assert any("dead of lease_expired" in v for v in check(evidence(**kw)).violations)
    report = check(evidence(**kw, db_restarts=[DbRestart(T0 + 1, T0 + 3.5)]))
    assert report.violations == []
    assert "lease_expired (database restart) 1" in str(report.flat())


def test_a_duplicate_is_explained_by_a_database_restart_only_when_it_ended_near_one() -> None:
    twice = [ran(1, 1, pid=500), ran(1, 2, pid=501)]  # the first ended at T0 + 0.02
    near = check(evidence(executions=twice, db_restarts=[DbRestart(T0 - 1, T0 + 1.5)]))
    assert near.violations == []
    assert near.flat()["duplicates.explained by a database restart"] == 1
    far = check(evidence(executions=twice, db_restarts=[DbRestart(T0 + 30, T0 + 32.5)]))
    assert any("job 1 completed 2 times" in v for v in far.violations)


def test_a_timeout_kill_later_than_timeout_plus_one_second_is_a_violation() -> None:
    def hang_failures(*durations: float) -> list[LoggedFailure]:
        return [
            LoggedFailure(T0 + a, "s1-1", 2, a, "timeout", "ran past its timeout", d)
            for a, d in enumerate(durations, start=1)
        ]

    stall = DbRestart(began=T0 + 1.5, ready=T0 + 2.5)  # the second kill ends in it
    on_time = evidence(failures=hang_failures(2.1, 2.9, 2.0), timeouts={"poison": 2.0})
    on_time.stalls = [stall]
    report = check(on_time)
    assert report.violations == []
    assert report.flat()["deadlines.timeout kills while the database stalled"] == 1

    late = check(evidence(failures=hang_failures(2.1, 3.4, 2.0), timeouts={"poison": 2.0}))
    assert any("job 2: killed 3.40s after its start, timeout 2s" in v for v in late.violations)
