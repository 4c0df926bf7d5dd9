"""supervisor.schedules: tick times and which due ticks a pass enqueues (pure: tables and a
fake clock, no database)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from supervisor.clock import FakeClock
from supervisor.model import JobState, ScheduleAdvance, ScheduleState, TickJob
from supervisor.schedules import (
    CATCH_UP_MAX,
    LATE_AFTER,
    MISFIRE,
    SCAN_CAP,
    ScheduleSpec,
    Timing,
    lateness,
    plan,
    tick_job,
    tick_key,
)

T0 = 1_800_000_000.0  # a multiple of 10 s: 2027-01-15T08:00:00Z


def spec(timing: Timing | None = None, **kw: object) -> ScheduleSpec:
    return ScheduleSpec(
        name="sync",
        timing=timing or Timing.of(None, 10),
        kind="echo",
        pool="bulk",
        max_deliveries=3,
        **kw,  # type: ignore[arg-type]
    )


def state(through: float, last: JobState | None = None) -> ScheduleState:
    recent = () if last is None else (TickJob(through, 7, last),)
    return ScheduleState("sync", created_at=T0, through=through, recent=recent)


# ---- tick times -----------------------------------------------------------------------------


def test_every_ticks_on_multiples_of_the_period_since_the_epoch() -> None:
    t = Timing.of(None, 300)
    assert t.after(T0 + 1) == T0 + 300 and t.after(T0) == T0 + 300
    assert t.next_ticks(T0 - 0.5, 3) == (T0, T0 + 300, T0 + 600)
    assert t.due(T0, T0 + 1000, keep=2) == (3, (T0 + 600, T0 + 900))
    assert t.due(T0, T0 + 299.9, keep=2) == (0, ())


def test_cron_ticks_in_its_time_zone() -> None:
    paris = Timing.of("0 2 * * *", None, "Europe/Paris")
    jan = datetime(2027, 1, 15, 12, tzinfo=UTC).timestamp()
    assert paris.after(jan) == datetime(2027, 1, 16, 1, tzinfo=UTC).timestamp()  # UTC+1
    jul = datetime(2027, 7, 15, 12, tzinfo=UTC).timestamp()
    assert paris.after(jul) == datetime(2027, 7, 16, 0, tzinfo=UTC).timestamp()  # UTC+2


@pytest.mark.parametrize(
    ("expr", "start"),
    [
        ("30 2 * * *", datetime(2027, 3, 27, 12)),  # spring forward: 02:30 does not exist
        ("30 2 * * *", datetime(2027, 10, 30, 12)),  # fall back: 02:30 happens twice
        ("0 * * * *", datetime(2027, 10, 31, 0, 30)),  # hourly across the repeated hour
        ("*/20 1-3 * * *", datetime(2027, 3, 28, 0, 50)),
    ],
)
def test_next_ticks_across_a_dst_change_are_the_cron_librarys(expr: str, start: datetime) -> None:
    tz = ZoneInfo("Europe/Paris")
    t = Timing.of(expr, None, "Europe/Paris")
    begin = start.replace(tzinfo=tz)
    library = CronSim(expr, begin)
    expected = tuple(next(library).timestamp() for _ in range(6))
    assert t.next_ticks(begin.timestamp(), 6) == expected
    assert len(set(expected)) == 6  # distinct instants, so distinct keys


def test_dst_ticks_as_debian_cron_runs_them() -> None:
    t = Timing.of("30 2 * * *", None, "Europe/Paris")
    spring = datetime(2027, 3, 27, 12, tzinfo=UTC).timestamp()
    # 2027-03-28 02:30 local does not exist: run at 03:00 CEST = 01:00Z, as Debian's cron does
    assert t.next_ticks(spring, 2) == (
        datetime(2027, 3, 28, 1, tzinfo=UTC).timestamp(),
        datetime(2027, 3, 29, 0, 30, tzinfo=UTC).timestamp(),
    )
    autumn = datetime(2027, 10, 30, 12, tzinfo=UTC).timestamp()
    # 2027-10-31 02:30 local happens twice: once, at the first (CEST, 00:30Z)
    assert t.next_ticks(autumn, 2) == (
        datetime(2027, 10, 31, 0, 30, tzinfo=UTC).timestamp(),
        datetime(2027, 11, 1, 1, 30, tzinfo=UTC).timestamp(),
    )


# ---- inside the repeated hour of a fall-back night ------------------------------------------
# cronsim reads the wall time: started in the second pass of the repeated hour it first yields
# the fixed-time tick of the first pass, already past. Nothing may come out before ``t``.

PARIS, NEW_YORK = ZoneInfo("Europe/Paris"), ZoneInfo("America/New_York")


def local(tz: ZoneInfo, *args: int, fold: int = 0) -> float:
    return datetime(*args, fold=fold, tzinfo=tz).timestamp()  # type: ignore[misc]


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


# (cron, zone, now: a wall time of the second pass) -> the next tick (UTC)
IN_THE_REPEATED_HOUR = [
    ("30 2 * * *", "Europe/Paris", (2024, 10, 27, 2, 10), utc(2024, 10, 28, 1, 30)),
    ("30 2 * * *", "Europe/Paris", (2024, 10, 27, 2, 0), utc(2024, 10, 28, 1, 30)),
    ("30 2 * * *", "Europe/Paris", (2024, 10, 27, 2, 29), utc(2024, 10, 28, 1, 30)),
    ("50 1 * * *", "America/New_York", (2024, 11, 3, 1, 10), utc(2024, 11, 4, 6, 50)),
    ("50 1 * * *", "America/New_York", (2024, 11, 3, 1, 49), utc(2024, 11, 4, 6, 50)),
    # ticks that the second pass has do come (hourly, every quarter hour)
    ("0 * * * *", "Europe/Paris", (2024, 10, 27, 2, 10), utc(2024, 10, 27, 2, 0)),
    ("*/15 * * * *", "Europe/Paris", (2024, 10, 27, 2, 10), utc(2024, 10, 27, 1, 15)),
]


@pytest.mark.parametrize(("expr", "tz", "wall", "expected"), IN_THE_REPEATED_HOUR)
def test_the_next_tick_from_inside_the_repeated_hour_is_later(
    expr: str, tz: str, wall: tuple[int, ...], expected: float
) -> None:
    t = Timing.of(expr, None, tz)
    now = local(ZoneInfo(tz), *wall, fold=1)
    assert t.after(now) == expected > now
    assert t.next_ticks(now, 1) == (expected,)
    assert lateness(spec(t), state(now), now + 60) == 0.0


@pytest.mark.parametrize(("expr", "tz", "wall", "expected"), IN_THE_REPEATED_HOUR)
def test_nothing_before_through_is_due_from_inside_the_repeated_hour(
    expr: str, tz: str, wall: tuple[int, ...], expected: float
) -> None:
    """A schedule registered (or last decided) in the second pass: no tick from before it."""
    t = Timing.of(expr, None, tz)
    now = local(ZoneInfo(tz), *wall, fold=1)
    count, ticks = t.due(now, now + 60, keep=5)
    assert (count, ticks) == ((1, (expected,)) if expected <= now + 60 else (0, ()))
    p = plan(spec(t), state(now), now + 60)
    assert p.next_tick is not None and p.next_tick > now + 60
    assert p.through is None or p.through > now
    assert all(tick > now for tick in p.enqueue)


def test_a_fall_back_night_of_passes_enqueues_each_tick_once_in_order() -> None:
    """Passes every 7 s through New York's fall-back night: every tick once, in order,
    ``through`` only forward, and each next tick after the pass's now."""
    daily = spec(Timing.of("50 1 * * *", None, "America/New_York"), overlap="allow")
    quarter = spec(Timing.of("*/15 * * * *", None, "America/New_York"), overlap="allow")
    start = local(NEW_YORK, 2024, 11, 3, 0, 30)
    for s, expected in [
        (daily, [utc(2024, 11, 3, 5, 50)]),
        (quarter, [start + 900 * k for k in range(1, 13)]),  # 00:45 EDT .. 02:15 EST
    ]:
        st, enqueued = state(start), []
        passes = range(int(start) + 7, int(start) + 3 * 3600 + 8, 7)
        for now in passes:
            p = plan(s, st, now)
            assert p.next_tick is not None and p.next_tick > now
            enqueued += p.enqueue
            if p.through is not None:
                assert p.through > st.through
                st = replace(st, through=p.through)
        assert enqueued == expected, s.timing


@pytest.mark.parametrize("tz", [PARIS, NEW_YORK])
@pytest.mark.parametrize("expr", ["30 2 * * *", "50 1 * * *", "0 * * * *", "*/20 1-3 * * *"])
def test_around_both_dst_changes_ticks_only_move_forward(expr: str, tz: ZoneInfo) -> None:
    """From every 10 minutes of both DST nights: the next tick is later, and the ticks a
    pass finds due are the ones ``after`` walks through."""
    t = Timing.of(expr, None, str(tz))
    nights = [datetime(2024, 3, 31, tzinfo=tz), datetime(2024, 3, 10, tzinfo=tz)]
    nights += [datetime(2024, 10, 27, tzinfo=tz), datetime(2024, 11, 3, tzinfo=tz)]
    for night in nights:
        for k in range(0, 6 * 6):
            now = night.timestamp() + 600 * k
            walked = t.next_ticks(now, 8)
            assert walked[0] > now and list(walked) == sorted(set(walked))
            count, due = t.due(now, walked[-1], keep=8)
            assert due == walked and count == 8


def test_a_gap_longer_than_the_scan_counts_at_least_the_cap_and_keeps_the_newest() -> None:
    t = Timing.of("* * * * * *", None)  # every second
    count, latest = t.due(T0, T0 + 2 * SCAN_CAP + 0.5, keep=3)
    assert count == SCAN_CAP
    assert latest == (T0 + 2 * SCAN_CAP - 2, T0 + 2 * SCAN_CAP - 1, T0 + 2 * SCAN_CAP)


@pytest.mark.parametrize(
    ("cron", "every", "zone", "fragment"),
    [
        ("61 * * * *", None, "UTC", "bad minute"),
        ("* * *", None, "UTC", "wrong number of fields"),
        ("0 0 30 2 *", None, "UTC", "bad day-of-month"),
        ("0 2 * * *", None, "Mars/Olympus", "not a time zone"),
        (None, 1.5, "UTC", "whole number of seconds"),
        (None, 0.5, "UTC", "whole number of seconds"),
        (None, 367 * 86400, "UTC", "367 days is too long"),
        ("* * * * *", 60, "UTC", "exactly one"),
        (None, None, "UTC", "exactly one"),
    ],
)
def test_bad_timings(cron: str | None, every: float | None, zone: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Timing.of(cron, every, zone)


def test_tick_key_and_job() -> None:
    s = spec(payload='{"full":true}', tenant="acme", priority=2)
    job = tick_job(s, T0)
    assert tick_key("sync", T0) == "schedule:sync:2027-01-15T08:00:00Z" == job.key
    assert job.payload == '{"full":true,"scheduled_for":"2027-01-15T08:00:00Z"}'
    assert (job.kind, job.pool, job.tenant, job.priority) == ("echo", "bulk", "acme", 2)


# ---- which ticks a pass enqueues ------------------------------------------------------------

# (catch_up, overlap, last job, seconds since through, now's offset into the period)
#   -> (enqueued, as offsets from through, on_time, late, missed, skipped)
PLANS = [
    # nothing due yet
    ("once", "skip", None, 0, 5, ((), 0, 0, 0, 0)),
    # the current tick, on time
    ("once", "skip", None, 10, 0.3, ((10,), 1, 0, 0, 0)),
    ("skip", "allow", None, 10, 0.3, ((10,), 1, 0, 0, 0)),
    # down for 50 s: ticks 10..50 missed, 60 is current
    ("skip", "allow", None, 60, 0.3, ((60,), 1, 0, 5, 0)),
    ("once", "allow", None, 60, 0.3, ((50, 60), 1, 1, 4, 0)),
    ("all", "allow", None, 60, 0.3, ((30, 40, 50, 60), 1, 3, 2, 0)),  # catch_up_max 3
    # overlap skip: one tick a pass, the newest chosen
    ("all", "skip", None, 60, 0.3, ((60,), 1, 0, 2, 3)),
    ("once", "skip", None, 60, 0.3, ((60,), 1, 0, 4, 1)),
    # overlap skip while the last tick's job is queued or running: nothing
    ("once", "skip", JobState.LEASED, 10, 0.3, ((), 0, 0, 0, 1)),
    ("once", "skip", JobState.QUEUED, 60, 0.3, ((), 0, 0, 4, 2)),
    ("once", "allow", JobState.LEASED, 10, 0.3, ((10,), 1, 0, 0, 0)),
    # a finished (or pruned) last job does not hold the next tick back
    ("once", "skip", JobState.DONE, 10, 0.3, ((10,), 1, 0, 0, 0)),
    ("once", "skip", JobState.DEAD, 10, 0.3, ((10,), 1, 0, 0, 0)),
]


@pytest.mark.parametrize(("catch_up", "overlap", "last", "gap", "into", "expected"), PLANS)
def test_plan(
    catch_up: str, overlap: str, last: JobState | None, gap: float, into: float, expected: tuple
) -> None:
    s = spec(catch_up=catch_up, catch_up_max=3, overlap=overlap)
    p = plan(s, state(T0, last), T0 + gap + into)
    enqueued, on_time, late, missed, skipped = expected
    assert p.enqueue == tuple(T0 + e for e in enqueued)
    assert (p.on_time, p.late, p.missed, p.skipped) == (on_time, late, missed, skipped)
    assert p.through == (T0 + gap if gap >= 10 else None)
    assert p.next_tick == T0 + gap + 10


def test_a_current_tick_seen_past_its_grace_is_missed() -> None:
    hourly = spec(Timing.of("0 * * * *", None), catch_up="skip")
    on_time = plan(hourly, state(T0 - 1), T0 + MISFIRE - 1)
    assert on_time.enqueue == (T0,) and on_time.on_time == 1
    missed = plan(hourly, state(T0 - 1), T0 + MISFIRE + 1)
    assert missed.enqueue == () and missed.missed == 1 and missed.through == T0
    once = plan(replace(hourly, catch_up="once"), state(T0 - 1), T0 + MISFIRE + 1)
    assert once.enqueue == (T0,) and once.late == 1 and once.on_time == 0


def test_a_new_schedule_is_not_backfilled() -> None:
    # first seen at T0 + 3: its row starts there, so only ticks after it are ever due
    nightly = spec(Timing.of("0 2 * * *", None), catch_up="all")
    assert plan(nightly, state(T0 + 3), T0 + 3).enqueue == ()
    assert plan(spec(catch_up="all"), state(T0 + 3), T0 + 10.2).enqueue == (T0 + 10,)


def test_a_fake_clock_day_of_passes_enqueues_every_tick_once() -> None:
    """Passes at uneven moments (a loaded machine) still enqueue each tick exactly once."""
    clock = FakeClock(T0)
    s = spec(catch_up="all", catch_up_max=3, overlap="allow")
    st = state(T0)
    enqueued: list[float] = []
    for step in [0.4, 3.3, 7.1, 0.2, 9.9, 10.0, 0.01, 14.7] * 50:
        clock.advance(step)
        p = plan(s, st, clock.now())
        enqueued += p.enqueue
        assert p.missed == 0 and p.skipped == 0
        if p.through is not None:
            st = replace(st, through=p.through)
    assert enqueued == [T0 + 10 * k for k in range(1, len(enqueued) + 1)]
    assert enqueued[-1] == (clock.now() // 10) * 10


def test_lateness_says_how_long_a_due_tick_waited_undecided() -> None:
    s = spec()
    assert lateness(s, None, T0 + 100) == 0.0
    assert lateness(s, state(T0), T0 + 9) == 0.0
    assert lateness(s, state(T0), T0 + 15) == 0.0  # within one period of tick T0 + 10
    assert lateness(s, state(T0), T0 + 10 + LATE_AFTER) == 0.0  # a pass may be this late
    assert lateness(s, state(T0), T0 + 45) == 45 - 10 - LATE_AFTER
    hourly = spec(Timing.of("0 * * * *", None))  # its grace is MISFIRE, above the floor
    assert lateness(hourly, state(T0 - 1), T0 + MISFIRE + 5) == 5.0


def test_a_short_period_is_not_late_while_a_pass_is_held_up() -> None:
    """every = "1s": a pass 10 s late (a chore ahead of it, a store backoff) is not a late
    schedule in ``fleetd status``; 20 s is."""
    s = spec(Timing.of(None, 1))
    assert LATE_AFTER > 10
    assert lateness(s, state(T0), T0 + 10.5) == 0.0
    assert lateness(s, state(T0), T0 + 1 + LATE_AFTER + 4) == 4.0


# (catch_up, overlap, seconds since through, the previous pass's now as an offset from
#   through) -> (enqueued, as offsets from through, on_time, late, missed, skipped)
# every 10 s, through T0, now T0 + gap + 0.3
HELD_UP = [
    # the previous pass 60 s ago saw through: every tick since came while it was passing
    ("skip", "allow", 60, 0.3, ((10, 20, 30, 40, 50, 60), 6, 0, 0, 0)),
    ("once", "allow", 60, 0.3, ((10, 20, 30, 40, 50, 60), 6, 0, 0, 0)),
    # it passed at +25 (ticks 10 and 20 were somebody else's and not decided: missed)
    ("skip", "allow", 60, 25, ((30, 40, 50, 60), 4, 0, 2, 0)),
    ("once", "allow", 60, 25, ((20, 30, 40, 50, 60), 4, 1, 1, 0)),
    # overlap skip: still one a pass, the newest; the others are skipped, not missed
    ("skip", "skip", 60, 0.3, ((60,), 1, 0, 0, 5)),
    # the previous pass more than MISFIRE ago (the store away for long): downtime
    ("skip", "allow", 70, 0.3, ((70,), 1, 0, 6, 0)),
    ("all", "allow", 70, 0.3, ((40, 50, 60, 70), 1, 3, 3, 0)),
]


@pytest.mark.parametrize(("catch_up", "overlap", "gap", "since", "expected"), HELD_UP)
def test_ticks_due_since_this_supervisor_s_previous_pass_are_on_time(
    catch_up: str, overlap: str, gap: float, since: float, expected: tuple
) -> None:
    """A running supervisor whose pass is held up did not miss the ticks that came
    meanwhile: they are on time, whatever ``catch_up`` says about downtime."""
    s = spec(catch_up=catch_up, catch_up_max=3, overlap=overlap)
    p = plan(s, state(T0), T0 + gap + 0.3, since=T0 + since)
    enqueued, on_time, late, missed, skipped = expected
    assert p.enqueue == tuple(T0 + e for e in enqueued)
    assert (p.on_time, p.late, p.missed, p.skipped) == (on_time, late, missed, skipped)
    assert p.through == T0 + gap


def test_passes_held_up_for_up_to_a_minute_miss_no_tick() -> None:
    """every = "1s", catch_up = "skip": passes held up 0-55 s (fake clock); each carries the
    previous pass's now. Every tick is enqueued once, none counted missed."""
    clock = FakeClock(T0)
    s = spec(Timing.of(None, 1), catch_up="skip", overlap="allow")
    st, since, enqueued = state(T0), None, []
    for step in [0.004, 1.0, 7.3, 30.0, 0.5, 55.0, 2.2, 14.9] * 20:
        clock.advance(step)
        p = plan(s, st, clock.now(), since)
        enqueued += p.enqueue
        assert p.missed == 0 and p.skipped == 0, step
        if p.through is not None:
            st = replace(st, through=p.through)
        since = clock.now()
    assert enqueued == [T0 + k for k in range(1, int(clock.now() - T0) + 1)]


def test_an_advance_only_moves_through_forward() -> None:
    assert ScheduleAdvance("sync", T0, T0 + 10).through == T0 + 10
    for through in (T0, T0 - 10):
        with pytest.raises(ValueError, match="goes back or stays"):
            ScheduleAdvance("sync", T0, through)
    with pytest.raises(ValueError, match="negative missed"):
        ScheduleAdvance("sync", T0, T0 + 10, missed=-1)


@pytest.mark.parametrize(
    "timing", [Timing.of("* * * * * *", None), Timing.of("* * * * *", None, "Europe/Paris")]
)
def test_the_largest_catch_up_after_a_gap_past_the_scan_counts_no_negative_miss(
    timing: Timing,
) -> None:
    """catch_up_max at its bound (1000, below SCAN_CAP): a year down enqueues the latest 1000
    and the current tick, and counts at least the rest of the scan as missed, never < 0."""
    s = spec(timing, catch_up="all", catch_up_max=CATCH_UP_MAX, overlap="allow")
    year = 365 * 86400
    p = plan(s, state(T0 - year), T0 + 0.5)
    assert CATCH_UP_MAX < SCAN_CAP
    assert len(p.enqueue) == CATCH_UP_MAX + 1 and p.enqueue[-1] == T0
    assert p.missed == SCAN_CAP - CATCH_UP_MAX - 1 and p.late == CATCH_UP_MAX


def test_every_catches_up_at_most_catch_up_max_ticks_in_one_pass() -> None:
    s = spec(Timing.of(None, 1), catch_up="all", catch_up_max=CATCH_UP_MAX, overlap="allow")
    p = plan(s, state(T0 - 30 * 86400), T0 + 0.5)
    assert len(p.enqueue) == CATCH_UP_MAX + 1
    assert p.missed == 30 * 86400 - CATCH_UP_MAX - 1  # the current tick is on time


@pytest.mark.parametrize("bad", [0, -1, CATCH_UP_MAX + 1, 10**6])
def test_a_spec_refuses_a_catch_up_max_outside_its_bounds(bad: int) -> None:
    with pytest.raises(ValueError, match="catch_up_max"):
        spec(catch_up_max=bad)


def test_the_fingerprint_names_the_timing_once_however_it_is_spelt() -> None:
    """The schedule row keeps it: a change starts the schedule afresh, a respelling must not."""
    paris = Timing.of("0  2 * *\t*", None, "Europe/Paris")
    assert paris.fingerprint() == 'cron "0 2 * * *" (Europe/Paris)' == paris.describe()
    assert paris.fingerprint() == Timing.of("0 2 * * *", None, "Europe/Paris").fingerprint()
    assert Timing.of(None, 300).fingerprint() == "every 300s"
    assert Timing.of("0 2 * * *", None).fingerprint() != paris.fingerprint()
