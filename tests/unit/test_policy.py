"""supervisor.policy: every rule as a table, exit statuses built the way the kernel reports them.

A wait status is ``code << 8`` for a process that exited, and the signal number (plus 0x80 when
a core was dumped) for one that was killed; ``os.waitstatus_to_exitcode`` checks each one we
build really is what we say it is.
"""

from __future__ import annotations

import doctest
import os
import random
import signal

import pytest

from supervisor import policy
from supervisor.model import ErrorKind
from supervisor.policy import (
    KillReason,
    backoff_cap,
    pipeline_depth,
    poll_delay,
    recent_duration,
    respawn_delay,
    retry_delay,
)
from supervisor.run.exits import classify_exit, describe_status

CORE_DUMPED = 0x80


def exited(code: int) -> int:
    status = code << 8
    assert os.waitstatus_to_exitcode(status) == code
    return status


def killed(sig: int, core: bool = False) -> int:
    status = sig | (CORE_DUMPED if core else 0)
    assert os.waitstatus_to_exitcode(status) == -sig
    return status


def test_doctests() -> None:
    result = doctest.testmod(policy, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "expected"),
    [
        (1, 1.0, 10.0, 1.0),
        (2, 1.0, 10.0, 2.0),
        (3, 1.0, 10.0, 4.0),
        (4, 1.0, 10.0, 8.0),
        (5, 1.0, 10.0, 10.0),  # 16 capped
        (1, 0.25, 600.0, 0.25),
        (3, 0.25, 600.0, 1.0),
        (0, 1.0, 10.0, 1.0),  # before the first failure: never below base
        (-5, 1.0, 10.0, 1.0),
        (64, 1.0, 600.0, 600.0),  # 2**63 s would be forever: the cap
        (10_000, 1.0, 600.0, 600.0),  # no OverflowError
        (3, 5.0, 5.0, 5.0),  # base == cap
    ],
)
def test_backoff_cap(attempt: int, base: float, cap: float, expected: float) -> None:
    assert backoff_cap(attempt, base, cap) == expected


class Extremes:
    """A "random" source that always returns one end of the range, recording what it was asked."""

    def __init__(self, end: str) -> None:
        self.end = end
        self.calls: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.calls.append((a, b))
        return a if self.end == "low" else b


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "upper"),
    [(1, 1.0, 600.0, 1.0), (2, 1.0, 600.0, 2.0), (4, 0.5, 3.0, 3.0), (50, 1.0, 600.0, 600.0)],
)
def test_retry_delay_is_full_jitter_between_zero_and_the_cap(
    attempt: int, base: float, cap: float, upper: float
) -> None:
    low, high = Extremes("low"), Extremes("high")
    assert retry_delay(attempt, base, cap, low) == 0.0
    assert retry_delay(attempt, base, cap, high) == upper
    assert low.calls == high.calls == [(0.0, upper)]


@pytest.mark.parametrize("seed", [0, 1, 42, 2024])
def test_retry_delay_with_a_seeded_random_stays_in_bounds_and_spreads(seed: int) -> None:
    rng = random.Random(seed)
    for attempt in range(1, 12):
        cap = backoff_cap(attempt, 0.5, 20.0)
        delays = [retry_delay(attempt, 0.5, 20.0, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in delays)
        # full jitter, not "cap plus a little": the delays cover the range
        assert min(delays) < 0.1 * cap and max(delays) > 0.9 * cap
    again = random.Random(seed)
    assert retry_delay(3, 1.0, 10.0, random.Random(seed)) == retry_delay(3, 1.0, 10.0, again)


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(-1, 0.0), (0, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (10_000, 30.0)],
)
def test_respawn_delay(failures: int, expected: float) -> None:
    assert respawn_delay(failures) == expected


def test_respawn_delay_never_decreases() -> None:
    delays = [respawn_delay(n) for n in range(0, 100)]
    assert delays == sorted(delays)
    assert delays[-1] == policy.RESPAWN_MAX


@pytest.mark.parametrize(
    ("empty", "expected"),
    [(0, 0.05), (1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (6, 1.0), (10_000, 1.0)],
)
def test_poll_delay(empty: int, expected: float) -> None:
    assert poll_delay(empty) == pytest.approx(expected)
    assert policy.POLL_MIN <= poll_delay(empty) <= policy.POLL_MAX


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (exited(0), "exited with code 0 (OK)"),
        (exited(3), "exited with code 3"),
        (exited(1), "exited with code 1 (UNCAUGHT)"),
        (exited(82), "exited with code 82 (SETUP_FAILED)"),
        (exited(83), "exited with code 83 (RECYCLE)"),
        (exited(255), "exited with code 255"),
        (killed(signal.SIGSEGV), "killed by SIGSEGV"),
        (killed(signal.SIGSEGV, core=True), "killed by SIGSEGV"),
        (killed(signal.SIGKILL), "killed by SIGKILL"),
        (killed(signal.SIGABRT, core=True), "killed by SIGABRT"),
        (killed(signal.SIGBUS), "killed by SIGBUS"),
        (killed(40), "killed by signal 40"),  # a real-time signal without a name
    ],
)
def test_describe_status(status: int, text: str) -> None:
    assert describe_status(status) == text


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (exited(3), "worker exited with code 3"),
        (exited(0), "worker exited with code 0 (OK)"),  # exiting mid-job is a crash too
        (exited(83), "worker exited with code 83 (RECYCLE)"),  # forged by a handler
        (killed(signal.SIGSEGV), "worker killed by SIGSEGV"),
        (killed(signal.SIGSEGV, core=True), "worker killed by SIGSEGV"),
        (killed(signal.SIGFPE), "worker killed by SIGFPE"),
    ],
)
def test_a_worker_that_dies_on_its_own_crashed(status: int, message: str) -> None:
    verdict = classify_exit(status, None)
    assert (verdict.action, verdict.error_kind, verdict.message) == (
        "fail",
        ErrorKind.CRASHED,
        message,
    )


def test_a_sigkill_nobody_ordered_hints_at_the_oom_killer() -> None:
    verdict = classify_exit(killed(signal.SIGKILL), None)
    assert verdict.action == "fail" and verdict.error_kind is ErrorKind.CRASHED
    assert verdict.message.startswith("worker killed by SIGKILL")
    assert "OOM killer" in verdict.message


@pytest.mark.parametrize("status", [killed(signal.SIGKILL), exited(3), killed(signal.SIGSEGV)])
@pytest.mark.parametrize(
    ("reason", "action", "kind", "message"),
    [
        (KillReason("memory_limit", "RSS 300 MiB"), "fail", ErrorKind.MEMORY_LIMIT, "RSS 300 MiB"),
        (KillReason("timeout", "ran past 1s"), "fail", ErrorKind.TIMEOUT, "ran past 1s"),
        (KillReason("lease_lost", "taken over"), "forget", None, "taken over"),
        (KillReason("drain", "grace period over"), "release", None, "grace period over"),
        (KillReason("retire", ""), "release", None, "worker stopped (retire)"),
        (KillReason("drain"), "release", None, "worker stopped (drain)"),
    ],
)
def test_the_parents_kill_reason_wins_over_the_status(
    status: int, reason: KillReason, action: str, kind: ErrorKind | None, message: str
) -> None:
    verdict = classify_exit(status, reason)
    assert (verdict.action, verdict.error_kind, verdict.message) == (action, kind, message)


@pytest.mark.parametrize(
    ("recent", "limit", "depth"),
    [
        (None, 64, 1),  # nothing measured yet: never queue
        (0.0, 64, 64),  # no-op jobs: up to the pool's limit
        (0.00005, 64, 40),  # 50 µs + the worker's own ~50 µs: 4 ms hold 40
        (0.0005, 64, 7),
        (0.004, 64, 1),  # a few milliseconds: one at a time
        (5.0, 64, 1),
        (0.0, 1, 1),  # pipeline = 1 turns it off
        (0.0, 4, 4),
    ],
)
def test_pipeline_depth(recent: float | None, limit: int, depth: int) -> None:
    assert pipeline_depth(recent, limit) == depth


def test_recent_duration_rises_at_once_and_falls_slowly() -> None:
    est = recent_duration(None, 0.0001)
    assert est == 0.0001
    est = recent_duration(est, 2.0)  # one slow job: queueing stops at once
    assert est == 2.0 and pipeline_depth(est, 64) == 1
    fast = 0
    while pipeline_depth(est, 64) == 1:
        est = recent_duration(est, 0.0001)
        fast += 1
    assert 100 < fast < 300  # ...and resumes only after a long run of fast jobs


def test_recent_duration_follows_short_jitter_only_part_way() -> None:
    est = 0.0001  # INCR-like jobs: depth 26
    assert pipeline_depth(est, 64) == 26
    est = recent_duration(est, 0.003)  # one round trip of 3 ms: short of the budget
    assert pipeline_depth(est, 64) >= 13  # not cut to 1 for the next hundred jobs
    for _ in range(10):  # ...but a pool whose jobs really became slower follows them
        est = recent_duration(est, 0.003)
    assert pipeline_depth(est, 64) <= 3


def test_a_worker_ended_by_its_own_deadline_alarm_ran_past_its_timeout() -> None:
    from workers.limits import DEADLINE_SIGNAL

    verdict = classify_exit(int(DEADLINE_SIGNAL), None)  # a wait status: killed by it
    assert verdict.action == "fail" and verdict.error_kind is ErrorKind.TIMEOUT
    assert "own deadline alarm" in verdict.message
