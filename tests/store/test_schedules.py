"""The schedule table's verbs on both engines: first sight starts now, the advance is a
compare-and-set that enqueues and updates in one transaction, racing processes make one job
per tick, and the last success survives a later tick's job running."""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text

from supervisor.model import Ack, JobState, ScheduleAdvance
from supervisor.run.counters import Counters
from supervisor.run.link import execute
from supervisor.run.outbox import StoreHealth
from supervisor.run.requests import SchedulePass
from supervisor.run.schedulepass import Passes, schedule_pass
from supervisor.run.scheduler import MAX_WAIT, Scheduler
from supervisor.run.storelink import InlineLink
from supervisor.schedules import ScheduleSpec, Timing, tick_job, tick_key
from supervisor.store import open_store
from supervisor.store.schema import TICKS_KEPT
from tests.support.wait import eventually

NEW_YORK = ZoneInfo("America/New_York")
SPEC = ScheduleSpec(
    name="sync",
    timing=Timing.of(None, 10),
    kind="echo",
    pool="bulk",
    max_deliveries=3,
    catch_up="all",
    catch_up_max=3,
    overlap="allow",
)
TIMING = SPEC.timing.fingerprint()


def advance(store: Any, expected: float, ticks: list[float], missed: int = 0) -> Any:
    jobs = tuple((t, tick_job(SPEC, t)) for t in ticks)
    advance = ScheduleAdvance("sync", expected, ticks[-1], jobs, missed, TIMING)
    return store.advance_schedule(advance)


def test_a_schedule_seen_first_starts_now_and_registering_again_changes_nothing(store, clock):
    assert store.schedule_states(["sync"]).states == {}
    store.register_schedules({"sync": TIMING})
    first = store.schedule_states(["sync"]).states["sync"]
    assert first.through == first.created_at == clock.now() and first.last_tick is None
    clock.advance(30)
    store.register_schedules({"sync": TIMING})
    assert store.schedule_states(["sync"]).states["sync"] == first
    assert set(store.schedule_states().states) == {"sync"}  # None: every row


def test_advance_is_a_compare_and_set_that_enqueues_in_the_same_transaction(store, clock):
    store.register_schedules({"sync": TIMING})
    start = store.schedule_states(["sync"]).states["sync"].through
    t1 = (start // 10 + 1) * 10
    done = advance(store, start, [t1], missed=2)
    assert done.took and [t for t, _ in done.enqueued] == [t1]
    (_, job_id) = done.enqueued[0]
    job = store.get(job_id)
    assert job.key == tick_key("sync", t1) and job.payload["scheduled_for"].endswith("Z")
    # a second supervisor with the same plan: refused, nothing written
    again = advance(store, start, [t1], missed=2)
    assert not again.took and again.enqueued == ()
    assert [j.id for j in store.list_jobs()] == [job_id]
    row = store.schedule_states(["sync"]).states["sync"]
    assert (row.through, row.last_tick, row.last_job_id, row.missed) == (t1, t1, job_id, 2)
    assert [(t.tick, t.job_id, t.state) for t in row.recent] == [(t1, job_id, JobState.QUEUED)]


def test_an_existing_key_is_the_tick_s_job(store, clock):
    """Were a tick ever enqueued outside the advance (a key typed by hand), it stays one job."""
    store.register_schedules({"sync": TIMING})
    start = store.schedule_states(["sync"]).states["sync"].through
    t1 = (start // 10 + 1) * 10
    existing = store.enqueue(tick_job(SPEC, t1))
    done = advance(store, start, [t1])
    assert done.enqueued == ((t1, existing),) and done.adopted == (t1,)
    assert len(store.list_jobs()) == 1


def test_a_pass_that_finds_a_tick_s_job_there_already_says_so(store, clock, caplog):
    scheduler = Scheduler(
        InlineLink(store, clock.monotonic), [SPEC], clock, StoreHealth(Counters())
    )
    scheduler.tick(clock.monotonic(), draining=False)  # first sight
    existing = store.enqueue(tick_job(SPEC, clock.now() + 10))  # by hand, with its key
    clock.advance(10)
    caplog.set_level(logging.WARNING, "fleetd.schedules")
    scheduler.tick(clock.monotonic(), draining=False)
    (o,) = scheduler.report.outcomes
    assert o.enqueued == ((clock.now(), existing),) and o.adopted == (clock.now(),)
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"named job {existing}, there already" in line


def advance_n(store: Any, n: int) -> list[int]:
    """Enqueue the next ``n`` ticks, one advance each; their job ids."""
    store.register_schedules({"sync": TIMING})
    through = store.schedule_states(["sync"]).states["sync"].through
    ids = []
    for _ in range(n):
        tick = (through // 10 + 1) * 10
        ids.append(advance(store, through, [tick]).enqueued[0][1])
        through = tick
    return ids


def test_recent_ticks_are_trimmed(store, clock):
    ids = advance_n(store, TICKS_KEPT + 3)
    row = store.schedule_states(["sync"]).states["sync"]
    assert [t.job_id for t in row.recent] == ids[-TICKS_KEPT:]
    assert row.last_job_id == ids[-1]


def test_the_last_success_is_seen_while_a_later_tick_s_job_waits(store, clock):
    first, second = advance_n(store, 2)
    (claimed,) = store.claim(pool="bulk", kinds={"echo"}, n=1, node="n", lease=30)
    assert claimed.job_id == first
    clock.advance(5)
    store.ack([Ack(claimed.lease)])
    row = store.schedule_states(["sync"]).states["sync"]
    assert row.busy() and row.last.job_id == second  # overlap = "skip" would wait
    assert row.latest_success() == clock.now() and row.last_success_at is None
    assert store.note_schedule_success("sync", clock.now())
    assert not store.note_schedule_success("sync", clock.now() - 1)  # never goes back
    assert store.schedule_states(["sync"]).states["sync"].last_success_at == clock.now()


def test_a_pass_catches_up_from_the_stored_row(store, clock):
    """The store process's pass: registers, plans from the row, writes; after a gap of five
    periods, ``catch_up = "all"`` (max 3) enqueues the three latest missed and the current."""
    assert schedule_pass(store, [SPEC]).outcomes[0].enqueued == ()
    clock.advance(10)
    first = schedule_pass(store, [SPEC]).outcomes[0]
    assert first.took and len(first.enqueued) == 1 and first.plan.on_time == 1
    clock.advance(50)
    report = schedule_pass(store, [SPEC])
    (o,) = report.outcomes
    assert (len(o.enqueued), o.plan.late, o.plan.missed) == (4, 3, 1)
    assert report.states["sync"].missed == 1
    assert schedule_pass(store, [SPEC]).outcomes[0].enqueued == ()  # nothing twice


def test_a_scheduler_in_the_repeated_hour_does_not_spin(store, clock):
    """New York's fall-back night, in the second 01:05: the next 01:50 is tomorrow's, so the
    loop's scheduler passes at most every ``MAX_WAIT``, and no tick from before the schedule
    existed is enqueued. (The next tick once came out as tonight's first 01:50, already past:
    a pass every 5 ms.)"""
    clock.advance(datetime(2027, 11, 7, 1, 5, fold=1, tzinfo=NEW_YORK).timestamp() - clock.now())
    nightly = replace(SPEC, name="nightly", timing=Timing.of("50 1 * * *", None, str(NEW_YORK)))
    link = InlineLink(store, clock.monotonic)
    passes = 0

    def counted(request: Any, on_reply: Any) -> None:
        nonlocal passes
        passes += 1
        InlineLink.submit(link, request, on_reply=on_reply)

    link.submit = counted  # type: ignore[method-assign]
    scheduler = Scheduler(link, [nightly], clock, StoreHealth(Counters()))
    end = clock.monotonic() + 60
    while clock.monotonic() < end:  # the loop: pass when due, sleep until the next is due
        scheduler.tick(clock.monotonic(), draining=False)
        due = scheduler.due_at()
        assert due is not None
        clock.advance(max(0.001, due - clock.monotonic()))
    assert passes <= 60 / MAX_WAIT + 1, passes
    assert store.list_jobs() == []
    row = store.schedule_states(["nightly"]).states["nightly"]
    assert row.through == row.created_at and scheduler.report is not None
    assert scheduler.report.next_tick == datetime(2027, 11, 8, 6, 50, tzinfo=UTC).timestamp()


def test_a_schedule_the_database_refuses_stops_only_itself(store, clock, caplog):
    """A priority past 64 bits (sqlite3: OverflowError; PostgreSQL: out of range) refused at
    each tick: the other schedule is enqueued at every tick, the refused one is that
    schedule's error (in the reply, the snapshot's view), logged once, not at each pass."""
    good = replace(SPEC, name="good")
    bad = replace(SPEC, name="bad", priority=2**63)
    link = InlineLink(store, clock.monotonic)
    scheduler = Scheduler(link, [bad, good], clock, StoreHealth(Counters()))
    caplog.set_level(logging.WARNING, "fleetd.schedules")
    for _ in range(6):  # first sight, then five ticks
        reply = execute(store, SchedulePass([bad, good]), clock.monotonic)
        assert reply.error is None
        scheduler._passed(reply)
        clock.advance(10)
    outcomes = {o.name: o for o in reply.value.outcomes}
    assert "refused a value" in outcomes["bad"].error or "out of range" in outcomes["bad"].error
    assert outcomes["good"].error is None and outcomes["good"].took
    keys = [j.key for j in store.list_jobs()]
    assert len(keys) == 5 and all(k.startswith("schedule:good:") for k in keys)
    views = scheduler.views(clock.monotonic())
    assert views["bad"].error == outcomes["bad"].error and views["good"].error is None
    refused = [r for r in caplog.records if "schedule bad: not enqueued" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR


@pytest.mark.parametrize("what", ["name", "tenant"])
def test_a_refused_first_sight_stops_only_that_schedule(store, clock, engine, what):
    """A name or tenant longer than the column (PostgreSQL refuses; config refuses first)."""
    long = "x" * 201
    bad = replace(SPEC, name=long) if what == "name" else replace(SPEC, name="bad", tenant=long)
    good = replace(SPEC, name="good")
    schedule_pass(store, [bad, good])
    clock.advance(10)
    outcomes = {o.name: o for o in schedule_pass(store, [bad, good]).outcomes}
    assert outcomes["good"].took and len(outcomes["good"].enqueued) == 1
    refused = outcomes[bad.name].error
    assert (refused is not None) == (engine == "postgres"), refused
    if refused is not None:
        assert "character varying(200)" in refused


def test_a_held_up_pass_enqueues_the_ticks_that_came_meanwhile(store, clock):
    """every = "1s", catch_up = "skip", through the loop's scheduler: a pass held up 20 s (a
    VACUUM ahead of it on the link) enqueues the 20 ticks as on time, none missed; 90 s
    without a pass (the store away for long) is downtime, per catch_up."""
    beat = replace(SPEC, name="beat", timing=Timing.of(None, 1), catch_up="skip")
    scheduler = Scheduler(
        InlineLink(store, clock.monotonic), [beat], clock, StoreHealth(Counters())
    )

    def pass_after(seconds: float) -> Any:
        clock.advance(seconds)
        scheduler.tick(clock.monotonic(), draining=False)
        assert scheduler.report is not None
        return scheduler.report.outcomes[0].plan

    pass_after(0)  # first sight: starts now
    assert pass_after(scheduler.due_at() - clock.monotonic()).on_time == 1
    held_up = pass_after(20)
    assert (held_up.on_time, held_up.late, held_up.missed) == (20, 0, 0)
    assert len(store.list_jobs()) == 21 and scheduler.ticks[("beat", "missed")] == 0
    away = pass_after(90)
    assert (away.on_time, away.late, away.missed) == (1, 0, 89)


def test_two_first_registrations_in_different_orders_do_not_deadlock(store, engine):
    """PostgreSQL: another supervisor's transaction has inserted "a" and will insert "b";
    this one registers ["b", "a"]. In config order it would hold "b" and wait on "a" while
    the other waits on "b": a deadlock. In name order it waits on "a" holding nothing."""
    if engine != "postgres":
        pytest.skip("SQLite's BEGIN IMMEDIATE serialises the two transactions outright")
    other = store.engine.connect()
    tx = other.begin()
    store._exec(other, store._register_stmt, {"s_name": "a", "s_timing": TIMING})
    done: queue.Queue[BaseException | None] = queue.Queue()

    def register() -> None:
        try:
            store.register_schedules({"b": TIMING, "a": TIMING})
            done.put(None)
        except BaseException as exc:
            done.put(exc)

    thread = threading.Thread(target=register)
    thread.start()
    try:
        with store.engine.connect() as watch:  # until this one waits on a lock
            waiting = text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            eventually(lambda: watch.execute(waiting).scalar_one() >= 1)
        store._exec(
            other, store._register_stmt, {"s_name": "b", "s_timing": TIMING}
        )  # deadlocks in config order
        tx.commit()
    finally:
        other.close()
        thread.join(30)
    assert done.get(timeout=1) is None
    assert set(store.schedule_states().states) == {"a", "b"}


# ---- a changed timing ------------------------------------------------------------------------

DAILY = replace(SPEC, name="sync", timing=Timing.of(None, 86_400), catch_up_max=10)
MINUTELY = replace(DAILY, timing=Timing.of(None, 60))


def test_a_changed_timing_starts_afresh_instead_of_backfilling(store, clock):
    """every "1d" became "1m" with catch_up "all": the minutes since the last daily tick never
    existed, so nothing is caught up or counted missed; the row takes the new timing and the
    next minute is the first tick."""
    old = schedule_pass(store, [DAILY])  # a supervisor with the old config registers it
    assert old.states["sync"].timing == "every 86400s"
    clock.advance(10 * 3600)
    new = schedule_pass(store, [MINUTELY])  # one with the new config, started now
    (o,) = new.outcomes
    assert o.retimed == "every 86400s" and o.enqueued == () and o.error is None
    row = new.states["sync"]
    assert (row.timing, row.timing_at, row.through) == ("every 60s", clock.now(), clock.now())
    assert row.missed == 0 and store.list_jobs() == []
    clock.advance(60)
    (o,) = schedule_pass(store, [MINUTELY], Passes(new.now, new.started)).outcomes
    assert len(o.enqueued) == 1 and o.plan.on_time == 1 and o.plan.missed == 0


def test_during_a_rolling_deploy_the_old_timing_stops_once_the_new_one_passed(store, clock):
    """A supervisor with the old config, started before the row took the new timing, leaves
    the schedule alone (its error says why) and its advance cannot take; restarted later with
    the old config, it is the newest started and wins the row back."""
    first = schedule_pass(store, [DAILY])
    old_passes = Passes(first.now, first.started)  # the old supervisor runs on
    clock.advance(3600)
    schedule_pass(store, [MINUTELY])  # the new one started: retimed
    clock.advance(16 * 3600)  # the old timing's next tick (00:00 UTC) is due
    (o,) = schedule_pass(store, [DAILY], Passes(clock.now() - 1, old_passes.started)).outcomes
    assert o.enqueued == () and not o.took and o.retimed is None
    assert "set by a supervisor started after this one" in (o.error or "")
    row = store.schedule_states(["sync"]).states["sync"]
    assert row.timing == "every 60s" and store.list_jobs() == []
    stale = ScheduleAdvance("sync", row.through, row.through + 1, (), 0, "every 86400s")
    assert not store.advance_schedule(stale).took  # planned by the old timing: refused
    clock.advance(10)
    (back,) = schedule_pass(store, [DAILY]).outcomes  # the old config, restarted now
    assert back.retimed == "every 60s" and back.error is None
    assert store.schedule_states(["sync"]).states["sync"].timing == "every 86400s"


def test_the_scheduler_logs_a_changed_timing(store, clock, caplog):
    schedule_pass(store, [DAILY])
    clock.advance(3600)
    scheduler = Scheduler(
        InlineLink(store, clock.monotonic), [MINUTELY], clock, StoreHealth(Counters())
    )
    caplog.set_level(logging.WARNING, "fleetd.schedules")
    scheduler.tick(clock.monotonic(), draining=False)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("schedule sync: its timing changed from every 86400s to every 60s")


# ---- racing processes ------------------------------------------------------------------------

PROCESSES = 4


def race(url: str, start: Any, results: Any) -> None:
    """Child: wait for the gate, then run passes for a few ticks of an every-1s schedule."""
    store = open_store(url)
    spec = ScheduleSpec(  # overlap allowed: nobody runs the jobs here
        name="race",
        timing=Timing.of(None, 1),
        kind="echo",
        pool="bulk",
        max_deliveries=3,
        overlap="allow",
    )
    try:
        start.wait(timeout=30)
        enqueued: list[float] = []
        deadline = store.now() + 3.5
        while store.now() < deadline:
            for o in schedule_pass(store, [spec]).outcomes:
                enqueued += [t for t, _ in o.enqueued]
            time.sleep(0.01)  # pacing, not waiting for anything: passes come this often
        results.put((enqueued, None))
    except BaseException as exc:
        results.put(([], repr(exc)))
    finally:
        store.close()


def test_racing_processes_enqueue_each_tick_once(db_url):
    open_store(db_url).close()  # migrated before the race
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=race, args=(db_url, start, results)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    start.set()
    found: list[float] = []
    try:
        for _ in procs:
            ticks, error = results.get(timeout=60)
            assert error is None, error
            found += ticks
    except queue.Empty:
        pytest.fail("a racing process did not report")
    finally:
        for p in procs:
            p.join(10)
    assert len(found) == len(set(found)) >= 3  # each tick once, whoever took it
    store = open_store(db_url)
    try:
        keys = [j.key for j in store.list_jobs()]
    finally:
        store.close()
    assert len(keys) == len(set(keys)) == len(found)
