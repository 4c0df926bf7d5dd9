"""run/scheduler.py without a store: how the loop's side paces passes and keeps what they
said (a fake chores link answers each pass; a fake clock)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from supervisor.clock import FakeClock
from supervisor.errors import StoreError, StoreUnavailable
from supervisor.run.counters import Counters
from supervisor.run.link import Reply
from supervisor.run.outbox import StoreHealth
from supervisor.run.requests import SchedulePass
from supervisor.run.schedulepass import Passes, PassReport
from supervisor.run.scheduler import BACKOFF_MAX, LOG_EVERY, MAX_WAIT, Scheduler
from supervisor.schedules import LATE_AFTER, ScheduleSpec, Timing

STORE_BACKOFF_MAX = 5.0  # run/outbox.py StoreHealth: 100 ms doubling to 5 s
SPEC = ScheduleSpec("sync", Timing.of(None, 10), "echo", "bulk", 3)


class Chores:
    """Answers each pass at once: with ``error`` when set, else an empty report."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.error: StoreError | None = StoreError("schedule_pass: KeyError: 'sync'")
        self.calls = 0

    def submit(self, request: SchedulePass, on_reply: Any) -> None:
        self.calls += 1
        if self.error is not None:
            on_reply(Reply(None, self.error, self.clock.monotonic()))
        else:
            passes = request.passes
            assert passes is not None
            now = self.clock.now()
            report = PassReport(now, (), {}, passes.started or now)
            on_reply(Reply(report, None, self.clock.monotonic()))


def run_loop(scheduler: Scheduler, clock: FakeClock, seconds: float) -> None:
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        scheduler.tick(clock.monotonic(), draining=False)
        due = scheduler.due_at()
        assert due is not None
        clock.advance(max(0.001, due - clock.monotonic()))


def test_a_failing_pass_backs_off_and_logs_only_when_something_changes(caplog) -> None:
    """A pass the database refuses (a StoreError, not the store being away): passes 1 s
    apart doubling to BACKOFF_MAX, one log line per reason and LOG_EVERY, the error on every
    schedule's view, and once it works again one line saying so."""
    clock = FakeClock()
    chores = Chores(clock)
    scheduler = Scheduler(chores, [SPEC], clock, StoreHealth(Counters()))
    caplog.set_level(logging.INFO, "fleetd.schedules")
    run_loop(scheduler, clock, 3600)
    assert (BACKOFF_MAX, LOG_EVERY) == (300, 600)
    assert chores.calls == 20  # at 0, 1, 3, 7 ... 511 s (doubling), then 811 ... 3511 s
    failed = [r for r in caplog.records if "the pass failed" in r.getMessage()]
    assert len(failed) == 6, [r.getMessage() for r in failed]  # 0, 811, 1411 ... 3211 s
    view = scheduler.views(clock.monotonic())["sync"]
    assert view.error == "the schedule pass fails: schedule_pass: KeyError: 'sync'"
    chores.error = StoreError("another reason")
    run_loop(scheduler, clock, BACKOFF_MAX)
    assert "another reason" in caplog.records[-1].getMessage()
    chores.error = None
    run_loop(scheduler, clock, BACKOFF_MAX)
    assert "works again" in caplog.records[-1].getMessage()
    assert scheduler.views(clock.monotonic())["sync"].error is None
    assert scheduler.health.failures == 0


def test_the_store_being_away_is_the_shared_store_backoff() -> None:
    clock = FakeClock()
    chores = Chores(clock)
    chores.error = StoreUnavailable("database unavailable: connection refused")
    health = StoreHealth(Counters())
    scheduler = Scheduler(chores, [SPEC], clock, health)
    scheduler.tick(clock.monotonic(), draining=False)
    assert health.failures == 1 and scheduler.pass_error is None
    assert scheduler.due_at() == pytest.approx(max(health.retry_at, clock.monotonic() + 1.0))


def test_a_pass_late_by_the_scheduler_s_own_waits_is_not_a_late_schedule() -> None:
    """``fleetd status`` calls a tick late only past LATE_AFTER: more than the longest a
    running scheduler waits between passes plus the longest store backoff."""
    assert MAX_WAIT + STORE_BACKOFF_MAX < LATE_AFTER


def test_each_pass_carries_the_previous_pass_s_now_and_the_first_s() -> None:
    clock = FakeClock()
    chores = Chores(clock)
    chores.error = None
    sent: list[Passes] = []
    submit = chores.submit

    def recorded(request: SchedulePass, on_reply: Any) -> None:
        sent.append(request.passes)
        submit(request, on_reply=on_reply)

    chores.submit = recorded  # type: ignore[method-assign]
    scheduler = Scheduler(chores, [SPEC], clock, StoreHealth(Counters()))
    run_loop(scheduler, clock, 12)
    t0 = 1_800_000_000.0
    assert sent == [Passes(), Passes(t0, t0), Passes(t0 + 5, t0)]  # a pass every MAX_WAIT
