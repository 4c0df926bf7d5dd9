"""Races between the loop and replies of its store process, driven by hand.

``DeferLink`` holds every call until the test answers it (in order), as a slow store process
would; ``ProcessLink`` tests use a real store process on a SQLite file. Each test lost a job,
spun the loop or swallowed an error before it was fixed."""

from __future__ import annotations

import json
import os
import select
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import load_config
from supervisor.errors import StoreError, StoreUnavailable
from supervisor.imports import import_handlers
from supervisor.model import JobState, Lease, NewJob, PoolHistory, PoolStats
from supervisor.policy import Ceiling
from supervisor.run import stopping
from supervisor.run.build import build_fleet
from supervisor.run.drain import DrainPhase
from supervisor.run.fleet import Fleet
from supervisor.run.link import StoreBug, deliver, execute
from supervisor.run.requests import (
    ArmedClaim,
    ClaimRated,
    ClaimRows,
    Disarm,
    GetJob,
    Prune,
    Reap,
    WriteResults,
)
from supervisor.run.storecalls import Results
from supervisor.run.storelink import ProcessLink
from supervisor.store import open_store
from supervisor.store.claim import ClaimRequest
from tests.integration.fleet import handlers, write_config
from tests.support import infleet
from tests.support.wait import eventually

pytestmark = pytest.mark.slow


class DeferLink:
    """A link whose calls wait until the test answers them, in order."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: list[tuple[Any, Any]] = []
        self.on_wake = lambda pools: None

    arms_claims = False

    def submit(self, request: Any, on_reply: Any) -> None:
        self.calls.append((request, on_reply))

    def answer(self) -> None:
        while self.calls:
            request, on_reply = self.calls.pop(0)
            deliver(on_reply, execute(self.store, request, time.monotonic))

    def names(self) -> list[str]:
        return [type(request).__name__ for request, _ in self.calls]

    def waiting_since(self) -> float | None:
        return None

    def pending(self) -> int:
        return len(self.calls)

    def attach(self, watch: Any, unwatch: Any) -> None:
        pass

    def start(self, child_cleanup: Any) -> None:
        pass

    def tick(self, now: float, child_cleanup: Any = None) -> None:
        pass

    def wait_idle(self, timeout: float) -> bool:  # as ProcessLink: every reply that comes
        self.answer()
        return True

    def close(self, timeout: float) -> None:
        pass


@pytest.fixture
def made(tmp_path: Path):
    fleets: list[Fleet] = []

    def make(**pool: Any) -> tuple[Fleet, Any, DeferLink]:
        base = {"min_workers": 1, "max_workers": 1, "lease": "30s"}
        keys = base | {"handlers": handlers("noop", "sleep")} | pool
        config = load_config(write_config(tmp_path, f"sqlite:///{tmp_path}/q.db", {"p": keys}))
        store = open_store(config.database)
        link = DeferLink(open_store(config.database))
        fleet = build_fleet(config, store, import_handlers(config), node_id="hand", link=link)
        fleet.parts.loop = infleet.HandLoop()  # type: ignore[assignment]
        infleet.inline_forks(fleet)
        fleets.append(fleet)
        return fleet, store, link

    yield make
    for fleet in fleets:
        infleet.stop_all(fleet)


def job(kind: str = "noop", **payload: Any) -> NewJob:
    return NewJob(kind, "p", json.dumps(payload), 1)


def quiet(fleet: Fleet, now: float) -> None:
    """Every timer of the loop far away."""
    fleet.publisher.next_publish = fleet.parts.scaler.next_eval = (
        fleet.parts.housekeeping.next_reap
    ) = now + 100
    fleet.next_watchdog = fleet.wakeups.next_waker_at = now + 100
    fleet.parts.controls.next_read = now + 100  # pauses and cancels (run/controls.py)
    for pool in fleet.parts.pools.values():
        pool.next_poll_at = now + 100
        fleet.parts.dispatcher.next_heartbeat[pool.name] = now + 100


def test_the_loop_sleeps_while_a_claim_is_answered(made) -> None:
    fleet, _store, link = made()
    pool, _ = infleet.one_worker(fleet, short_jobs=False)
    now = fleet.parts.clock.monotonic()
    fleet.parts.dispatcher.claim(pool, now)
    assert link.names() == ["ClaimRows"]
    quiet(fleet, now)
    pool.next_poll_at = now - 1  # its poll was due: that is why it claimed
    assert fleet.next_timeout() > 1.0  # the reply wakes the selector; no spinning meanwhile


def test_the_loop_sleeps_while_an_extend_is_answered(made) -> None:
    fleet, store, link = made()
    pool, _ = infleet.one_worker(fleet, short_jobs=False)
    store.enqueue_many([job("sleep", seconds=5)])
    now = fleet.parts.clock.monotonic()
    fleet.parts.dispatcher.claim(pool, now)
    link.answer()
    fleet.parts.dispatcher.heartbeat(pool, now)
    assert link.names() == ["Extend"]
    quiet(fleet, now)
    fleet.parts.dispatcher.next_heartbeat["p"] = now - 1
    assert fleet.next_timeout() > 1.0


def test_the_loop_sleeps_while_its_pool_is_paused(made) -> None:
    fleet, store, link = made()
    pool, _ = infleet.one_worker(fleet, short_jobs=False)
    store.enqueue_many([job()])
    store.pause("p")
    now = fleet.parts.clock.monotonic()
    fleet.parts.controls.tick(now)
    link.answer()  # the controls read: the pool is paused
    assert pool.paused
    quiet(fleet, now)
    pool.next_poll_at = now - 1  # its poll is due, and its worker idle: it claims nothing
    fleet.parts.dispatcher.claim(pool, now)
    assert link.names() == []
    assert fleet.next_timeout() > 1.0  # not 0 s each pass while the pause lasts
    store.resume("p")
    fleet.parts.controls.wake()
    fleet.parts.controls.tick(now)
    link.answer()
    assert not pool.paused
    assert pool.next_poll_at == 0.0  # resumed: it claims at once
    assert fleet.next_timeout() == 0.0


def test_a_paused_pool_is_not_saturated_and_scales_in_like_an_idle_one(made) -> None:
    fleet, _store, _link = made(min_workers=1, max_workers=4, scale_in_cooldown="10s")
    pool = fleet.parts.pools["p"]
    pool.target = 4  # at its ceiling
    ceiling = Ceiling("p", 4, "max_workers", 4, None, 1 << 30, None, 0, "configured", 1 << 30)
    behind = PoolStats("p", ready=500, oldest_ready_age=10_000.0)  # far past its target
    history = PoolHistory(completed=100, durations=(1.0,) * 10)
    scaling = fleet.parts.scaler.scaling["p"]
    now = fleet.parts.clock.monotonic()
    fleet.parts.scaler._decide(pool, behind, history, ceiling, now)
    assert scaling.saturated and pool.target == 4
    pool.paused_kinds = frozenset(pool.kinds)  # paused whole: its backlog waits on purpose
    fleet.parts.scaler._decide(pool, behind, history, ceiling, now + 1)
    assert not scaling.saturated and scaling.desired == 0
    fleet.parts.scaler._decide(pool, behind, history, ceiling, now + 12)  # the cooldown is over
    assert pool.target == 3  # in, one worker at a time, as an idle pool
    for step in range(3, 10):
        fleet.parts.scaler._decide(pool, behind, history, ceiling, now + 12 + step * 11)
    assert pool.target == 1  # down to min_workers, not below


def test_pauses_are_known_at_boot_before_any_claim(made, monkeypatch) -> None:
    fleet, store, link = made()
    store.pause("p")
    monkeypatch.setattr("supervisor.run.fleet.Loop", lambda signals: infleet.HandLoop())
    fleet.boot()  # the link's first controls read is not answered (it may fail or be slow)
    pool, _ = infleet.one_worker(fleet, short_jobs=False)
    store.enqueue_many([job()])
    assert pool.paused
    fleet.dispatch(fleet.parts.clock.monotonic())
    assert "ClaimRows" not in link.names()


def test_the_reaper_reports_a_job_it_cancelled(made, caplog) -> None:
    fleet, store, link = made()
    (jid,) = store.enqueue_many([job()])
    store.claim(pool="p", kinds={"noop"}, n=1, node="lost-host", lease=0.05)
    store.cancel([jid])  # requested: the host that held it is gone

    def reaped() -> bool:  # once its lease ran out
        fleet.parts.housekeeping.reap(fleet.parts.clock.monotonic(), 0.0)
        link.answer()
        return fleet.parts.counters.lease_expiries == 1

    eventually(reaped, timeout=5)
    assert store.get(jid).state is JobState.CANCELLED
    assert "0 requeued, 0 dead, 1 cancelled" in caplog.text
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "job_cancelled" in events and "job_lease_expired" not in events


def test_the_loop_sleeps_while_results_are_written(made) -> None:
    fleet, store, link = made()
    pool, worker = infleet.one_worker(fleet, short_jobs=False)
    store.enqueue_many([job()])
    now = fleet.parts.clock.monotonic()
    fleet.parts.dispatcher.claim(pool, now)
    link.answer()
    assert select.select([worker.fd], [], [], 5)[0]
    fleet.children.read_worker(worker)  # JobDone: an ack in the outbox
    fleet.parts.dispatcher.flush(fleet.parts.clock.monotonic(), force=True)
    assert link.names() == ["WriteResults"]
    quiet(fleet, now)
    assert fleet.next_timeout() > 1.0


def test_a_claim_answered_after_the_drain_began_is_released_before_the_exit(made) -> None:
    fleet, store, link = made()
    pool, worker = infleet.one_worker(fleet, short_jobs=False)
    (jid,) = store.enqueue_many([job()])
    now = fleet.parts.clock.monotonic()
    fleet.parts.dispatcher.claim(pool, now)  # in flight: the store is slow
    fleet.parts.drain.on_signal(now)  # SIGTERM
    stopping.begin_drain(fleet.parts, now)
    stopping.advance_drain(fleet.parts, now)  # the idle worker is stopped
    infleet.wait_exited(worker.pid)
    fleet.children.reap_children(fleet.parts.clock.monotonic())
    fleet.dispatch(fleet.parts.clock.monotonic())
    stopping.advance_drain(fleet.parts, fleet.parts.clock.monotonic())
    assert fleet.parts.drain.phase != DrainPhase.STOPPED  # the claim's reply is still to come
    link.answer()  # it comes: what it took goes back
    for _ in range(3):
        fleet.dispatch(fleet.parts.clock.monotonic())
        link.answer()
        stopping.advance_drain(fleet.parts, fleet.parts.clock.monotonic())
    assert fleet.parts.drain.phase == DrainPhase.STOPPED
    found = store.get(jid)
    assert found is not None and found.state is JobState.QUEUED and found.attempts == 0, found


def test_a_scaler_reply_after_the_drain_began_raises_no_target(made) -> None:
    fleet, store, link = made()
    pool, _ = infleet.one_worker(fleet, short_jobs=False)
    store.enqueue_many([job("sleep", seconds=5)])
    now = fleet.parts.clock.monotonic()
    fleet.parts.scaler.tick(now, draining=False)
    assert "ScalerRead" in link.names()
    fleet.parts.drain.on_signal(now)
    stopping.begin_drain(fleet.parts, now)
    link.answer()
    assert pool.target == 0


def test_the_emergency_stop_releases_a_claim_answered_during_it(made) -> None:
    fleet, store, _link = made()
    pool, _ = infleet.one_worker(fleet, short_jobs=False)
    (jid,) = store.enqueue_many([job()])
    fleet.parts.dispatcher.claim(
        pool, fleet.parts.clock.monotonic()
    )  # in flight when the loop fails
    stopping.stop_after_error(fleet.parts)
    found = store.get(jid)
    assert found is not None and found.state is JobState.QUEUED and found.attempts == 0, found


def test_a_bug_in_a_store_call_reaches_the_error_policy(made, monkeypatch) -> None:
    """A bug in a store call (not the database being away) is not retried forever: the link
    raises it in the loop, whose error policy stops the supervisor; the batch is kept."""
    fleet, _store, link = made()
    d = fleet.parts.dispatcher
    d.outbox.release(Lease(1, "x"))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the store")

    monkeypatch.setattr("supervisor.run.storecalls.write_results", broken)
    d.flush(fleet.parts.clock.monotonic(), force=True)
    with pytest.raises(StoreBug, match="a bug in the store"):
        link.answer()
    assert d.pending_writes == 1  # kept for the emergency stop


def test_the_controls_read_backs_off_when_the_store_is_away_and_raises_a_bug(made) -> None:
    fleet, _store, link = made()
    health = fleet.parts.dispatcher.health
    now = fleet.parts.clock.monotonic()

    def away(node: str) -> Any:
        raise StoreUnavailable("database is locked")

    link.store.controls = away
    fleet.parts.controls.tick(now)
    link.answer()
    assert health.failures == 1 and health.retry_at > now  # backoff, as every store call
    del link.store.controls
    fleet.parts.controls.wake()
    fleet.parts.controls.tick(health.retry_at)
    link.answer()
    assert health.failures == 0 and health.retry_at == 0.0  # a read that came back: ok()

    def broken(node: str) -> Any:
        raise RuntimeError("a bug in the store")

    link.store.controls = broken
    fleet.parts.controls.wake()
    fleet.parts.controls.tick(fleet.parts.clock.monotonic())
    with pytest.raises(StoreBug, match="a bug in the store"):  # the loop's error policy
        link.answer()
    assert health.failures == 0


# ---- a real store process -------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/q.db"
    store = open_store(url)
    yield url, store
    store.close()


def started(url: str, wrap_store: Any = None) -> ProcessLink:
    link = ProcessLink(url, title="t", listen=False, wrap_store=wrap_store)
    link.start(lambda: None)
    return link


class BrokenPrune:
    """A store whose prune is a bug (a TypeError) and whose statement for reap the database
    refuses (a plain StoreError); every other verb its own."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def prune(self, **kwargs: Any) -> Any:
        raise TypeError("a bug in prune")

    def reap(self, **kwargs: Any) -> Any:
        raise StoreError("database error: syntax error at or near SELEKT")


def replies_in(link: ProcessLink, n: int) -> None:
    """Until ``n`` reply frames are in the socket, unread."""
    assert link.sock is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert select.select([link.sock], [], [], 5)[0]
        waiting = len(link.sock.recv(1 << 20, __import__("socket").MSG_PEEK))
        if waiting and _frames_in(link, waiting) >= n:
            return
        time.sleep(0.01)
    raise AssertionError("replies did not come")


def _frames_in(link: ProcessLink, size: int) -> int:
    assert link.sock is not None
    data = link.sock.recv(size, __import__("socket").MSG_PEEK)
    count = at = 0
    while at + 4 <= len(data):
        at += 4 + int.from_bytes(data[at : at + 4], "big")
        count += at <= len(data)
    return count


def test_a_raising_callback_keeps_the_replies_read_with_it(db) -> None:
    url, _ = db
    link = started(url)
    got: list[Any] = []

    def boom(reply: Any) -> None:
        raise RuntimeError("a bug in a reply callback")

    link.submit(Prune(3600.0), on_reply=boom)
    link.submit(WriteResults(Results()), on_reply=got.append)
    replies_in(link, 2)
    with pytest.raises(RuntimeError):
        link.on_readable()
    assert link.wait_idle(2.0)  # the second reply was kept and is handled now
    assert len(got) == 1 and got[0].error is None
    link.close(1.0)


def test_a_reply_in_the_socket_when_the_store_process_dies_is_handled(db) -> None:
    url, store = db
    (jid,) = store.enqueue_many([job()])
    link = started(url)
    replies: list[Any] = []
    link.submit(ClaimRows(ClaimRequest("p", ["noop"], 1, "n1", 30.0)), on_reply=replies.append)
    replies_in(link, 1)  # answered, unread
    assert link.pid is not None
    os.kill(link.pid, signal.SIGKILL)  # then the store process dies
    _, status = os.waitpid(link.pid, 0)  # and its exit is reaped before the socket is read
    link.exited(status, time.monotonic())
    assert replies and replies[0].error is None and [row[0] for row in replies[0].value] == [jid]


def test_a_bug_reply_read_with_others_leaves_them_replies(db) -> None:
    """Replies behind a bug's, in the same read, reach their callbacks (a claim's leases are
    known to the loop) before the bug is raised; so do they when the store process died."""
    url, store = db
    (jid,) = store.enqueue_many([job()])
    link = started(url, wrap_store=BrokenPrune)
    replies: list[Any] = []
    link.submit(Prune(3600.0), on_reply=replies.append)
    link.submit(ClaimRows(ClaimRequest("p", ["noop"], 1, "n1", 30.0)), on_reply=replies.append)
    replies_in(link, 2)
    assert link.pid is not None
    os.kill(link.pid, signal.SIGKILL)
    _, status = os.waitpid(link.pid, 0)
    with pytest.raises(StoreBug, match="a bug in prune"):
        link.exited(status, time.monotonic())
    bug, claimed = replies
    assert isinstance(bug.error, StoreBug)
    assert claimed.error is None and [row[0] for row in claimed.value] == [jid]


def test_a_statement_the_database_refuses_is_a_bug_not_an_outage(db) -> None:
    url, _ = db
    link = started(url, wrap_store=BrokenPrune)
    replies: list[Any] = []
    link.submit(Reap(10), on_reply=replies.append)
    with pytest.raises(StoreBug, match="SELEKT"):
        while not replies:
            link.wait_idle(5.0)
    assert isinstance(replies[0].error, StoreBug)
    link.close(1.0)


def test_the_loop_sleeps_while_a_drain_waits_for_its_writes(made) -> None:
    """A drain whose workers are gone waits for its releases to be written (a stalled
    store): meanwhile nothing is due but the reply; the scaler's and the reaper's timers,
    which a drain never advances, must not spin the loop."""
    fleet, store, link = made()
    pool, worker = infleet.one_worker(fleet, short_jobs=False)
    store.enqueue_many([job("sleep", seconds=5)])
    now = fleet.parts.clock.monotonic()
    fleet.parts.dispatcher.claim(pool, now)
    link.answer()
    fleet.parts.drain.on_signal(now)
    stopping.begin_drain(fleet.parts, now)
    fleet.parts.drain.on_signal(now)  # a second signal: stop running jobs now
    stopping.advance_drain(fleet.parts, now)
    infleet.wait_exited(worker.pid)
    fleet.children.reap_children(fleet.parts.clock.monotonic())
    fleet.dispatch(fleet.parts.clock.monotonic())  # the release goes out, and is not answered
    assert link.names() == ["WriteResults"]
    quiet(fleet, now)
    fleet.parts.scaler.next_eval = fleet.parts.housekeeping.next_reap = (
        now - 1
    )  # long past, as in a drain
    assert fleet.next_timeout() > 0.5


def test_the_loop_sleeps_while_the_scaler_and_the_reaper_wait_for_figures(made) -> None:
    fleet, _store, link = made()
    infleet.one_worker(fleet, short_jobs=False)
    now = fleet.parts.clock.monotonic()
    fleet.parts.scaler.tick(now, draining=False)
    fleet.parts.housekeeping.reap(now, 0.5)
    assert link.names() == ["ScalerRead", "Reap"]
    quiet(fleet, now)
    fleet.parts.scaler.next_eval = fleet.parts.housekeeping.next_reap = (
        now - 1
    )  # due again meanwhile
    assert fleet.next_timeout() > 1.0


def test_an_armed_claim_runs_when_a_wake_up_names_its_pool(db_url: str) -> None:
    """A claim armed in the store process waits for a wake-up of its pool (PostgreSQL's
    NOTIFY, SQLite's datagram) or its poll, and runs the moment one comes: the job is
    claimed without a round trip to the loop. ``Disarm`` runs every armed claim at once (a
    drain)."""
    store = open_store(db_url)
    link = ProcessLink(db_url, title="t", listen=True)
    link.start(lambda: None)
    try:
        # a pool of its own: NOTIFY's channel is database-wide, other tests' pools too
        pool = f"armed-{uuid.uuid4().hex[:8]}"
        claim = ClaimRequest(pool, ["noop"], 1, "n1", 30.0)
        got: list[Any] = []
        link.submit(ArmedClaim(claim, 30.0), on_reply=got.append)
        behind: list[Any] = []  # answered in order: once it is, the claim is armed
        link.submit(GetJob(0), on_reply=behind.append)
        while not behind:
            link.wait_idle(0.05)
        assert got == []  # armed, nothing to claim yet
        (jid,) = store.enqueue_many([NewJob("noop", pool, "{}", 1)])  # its wake-up fires it
        t0 = time.monotonic()
        assert link.wait_idle(5.0)
        assert time.monotonic() - t0 < 1.0, "ran at the wake-up, not at its 30 s poll"
        assert [row[0] for row in got[0].value] == [jid]

        late: list[Any] = []
        link.submit(ArmedClaim(claim, 30.0), on_reply=late.append)
        link.submit(Disarm(), on_reply=lambda reply: None)
        assert link.wait_idle(5.0) and late[0].value == []
    finally:
        link.close(2.0)
        store.close()


class ArmLink(DeferLink):
    """DeferLink with the store process's armed claims (a NOTIFY is ``notify(pool)``)."""

    arms_claims = True

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.armed: dict[str, tuple[ArmedClaim, Any]] = {}

    def submit(self, request: Any, on_reply: Any) -> None:
        if isinstance(request, ArmedClaim):
            self.armed[request.claim.pool] = (request, on_reply)
        else:
            super().submit(request, on_reply=on_reply)

    def notify(self, pool: str) -> None:
        request, on_reply = self.armed.pop(pool)
        deliver(on_reply, execute(self.store, request, time.monotonic))


def test_an_armed_claim_answered_after_the_pool_lost_its_workers_hands_its_jobs_back(
    made,
) -> None:
    """An armed claim is sized when it is armed: scaled to zero meanwhile, the pool has no
    worker to run what its NOTIFY claimed. It goes back at once, not into a buffer whose
    leases would be extended for ever (the scaler sees no ready job, so no worker comes)."""
    fleet, store, deferred = made(min_workers=0)
    link = ArmLink(deferred.store)
    d = fleet.parts.dispatcher
    d.link = d.leases.link = d.outbox.link = link
    pool, worker = infleet.one_worker(fleet, short_jobs=False)
    d.claim(pool, fleet.parts.clock.monotonic())  # nothing queued: an empty claim
    link.answer()
    d.claim(pool, fleet.parts.clock.monotonic())  # armed now
    assert "p" in link.armed and "p" in d.armed
    pool.target = 0  # the scaler takes the idle pool to zero
    fleet.children.spawn(fleet.parts.clock.monotonic())
    infleet.wait_exited(worker.pid)
    fleet.children.reap_children(fleet.parts.clock.monotonic())
    assert not pool.workers
    (jid,) = store.enqueue_many([job()])
    link.notify("p")  # its NOTIFY runs the armed claim
    assert not d.buffer["p"]
    d.flush(fleet.parts.clock.monotonic(), force=True)
    link.answer()
    found = store.get(jid)
    assert found is not None and found.state is JobState.QUEUED and found.attempts == 0, found


def test_the_loop_sleeps_while_the_controls_are_read(made) -> None:
    fleet, store, link = made()
    infleet.one_worker(fleet, short_jobs=False)
    now = fleet.parts.clock.monotonic()
    fleet.parts.controls.tick(now)  # due at once after boot
    assert link.names() == ["ReadControls"]
    quiet(fleet, now)
    fleet.parts.controls.next_read = now - 1
    assert fleet.next_timeout() > 1.0  # its reply wakes the selector
    store.pause("p")
    link.answer()
    assert fleet.parts.pools["p"].paused and not fleet.parts.controls.reading


def test_a_rated_fair_pool_s_claim_carries_this_node_s_unwritten_results(made) -> None:
    """A rate-limited pool orders fairly between tenants on every claim (rated.py): its claim
    must say which of its leased jobs ended with their results still in the outbox, as a fair
    pool's plain claim does (the store's half: tests/store/test_rates.py). It said none."""
    fleet, store, link = made(rate_limit="100/s")
    pool, worker = infleet.one_worker(fleet, short_jobs=False)
    store.enqueue_many([NewJob("noop", "p", "{}", 1, tenant="t")])
    d = fleet.parts.dispatcher
    d.claim(pool, fleet.parts.clock.monotonic())
    link.answer()
    assert select.select([worker.fd], [], [], 5)[0]
    fleet.children.read_worker(worker)  # JobDone: an ack in the outbox, not written yet
    assert d.outbox.finished("p") == {"t": 1}
    pool.next_poll_at = 0.0
    d.claim(pool, fleet.parts.clock.monotonic())
    ((request, _),) = link.calls
    assert isinstance(request, ClaimRated) and request.claim.finished == {"t": 1}
