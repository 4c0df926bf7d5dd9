"""Waiters are told when jobs become final, on both engines (supervisor/store/finals.py):
every verb that can end a job (ack, a fail that dead-letters or cancels, a cancel of a queued
job, a release or a reap of a job whose cancel was asked, a reap at the delivery limit) wakes
a registered watch with the job's id, within its transaction (PostgreSQL) or right after its
commit (SQLite).

PostgreSQL's channel is per database, so tests running at the same time in other schemas may
name ids too: these tests only assert that the expected ids are heard, except on SQLite, whose
folder is per file, where a retry must wake nobody.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from supervisor.model import Ack, ErrorKind, Failure, JobState, Lease, NewJob
from supervisor.store.finals import (
    EVERYTHING,
    PAYLOAD_IDS,
    WAITERS,
    FinalAnnouncer,
    LocalFinalWatch,
    final_payload,
    parse_payload,
)


def job(**kw) -> NewJob:
    kw.setdefault("max_deliveries", 3)
    return NewJob(kind="render", pool="bulk", payload=json.dumps({"n": 1}), **kw)


def claim(store, n: int = 1, lease: float = 30.0):
    return store.claim(pool="bulk", kinds={"render"}, n=n, node="node-a", lease=lease)


def ack(lease: Lease) -> Ack:
    return Ack(lease, "null", None, 0.001)


@contextmanager
def watching(store) -> Iterator[object]:
    """A registered watch. On SQLite a supervisor's wake-up socket is there too (the store
    answers None when no supervisor uses the file on this host: nobody would announce)."""
    waker = store.waker()
    watch = store.final_watch()
    try:
        assert watch is not None
        yield watch
    finally:
        if watch is not None:
            watch.close()
        waker.close()


def heard(watch, ids: set[int], timeout: float = 5.0) -> set[int] | None:
    """What the watch was told until it had heard ``ids`` (or EVERYTHING)."""
    got: set[int] = set()
    deadline = time.monotonic() + timeout
    while not ids <= got and time.monotonic() < deadline:
        named = watch.wait(deadline - time.monotonic())
        if named is EVERYTHING:
            return EVERYTHING
        got |= named
    return got


def test_an_ack_wakes_the_watch_with_its_ids(store):
    ids = store.enqueue_many([job(), job()])
    leases = [c.lease for c in claim(store, 2)]
    with watching(store) as watch:
        assert store.ack([ack(lease) for lease in leases]) == []
        assert set(ids) <= heard(watch, set(ids))


def test_an_ack_with_a_stale_lease_wakes_only_for_the_rows_it_wrote(store, engine):
    a, b = store.enqueue_many([job(), job()])
    leases = {c.job_id: c.lease for c in claim(store, 2)}
    store.release([leases[b]])  # b's lease is no longer good
    with watching(store) as watch:
        assert store.ack([ack(leases[a]), ack(leases[b])]) == [leases[b]]
        got = heard(watch, {a})
        assert a in got
        if engine == "sqlite":
            assert b not in got


def test_a_failure_that_dead_letters_wakes_the_watch_and_a_retry_does_not(store, engine):
    retried, dead = store.enqueue_many([job(), job()])
    leases = {c.job_id: c.lease for c in claim(store, 2)}
    with watching(store) as watch:
        store.fail(
            [
                Failure(leases[retried], ErrorKind.EXCEPTION, "boom", retry_delay=5.0),
                Failure(leases[dead], ErrorKind.PERMANENT, "no", retry_delay=None),
            ]
        )
        got = heard(watch, {dead})
        assert dead in got
        if engine == "sqlite":
            assert retried not in got
            assert watch.wait(0.05) == frozenset()
    assert store.get(dead).state is JobState.DEAD


def test_a_cancel_of_a_queued_job_wakes_the_watch(store):
    jid = store.enqueue(job())
    with watching(store) as watch:
        assert store.cancel([jid]).cancelled == (jid,)
        assert jid in heard(watch, {jid})


def test_a_cancelled_delivery_ended_by_release_or_fail_wakes_the_watch(store):
    released, failed = store.enqueue_many([job(), job()])
    leases = {c.job_id: c.lease for c in claim(store, 2)}
    store.cancel([released, failed])  # requested only: both are leased
    with watching(store) as watch:
        store.release([leases[released]])
        store.fail([Failure(leases[failed], ErrorKind.CRASHED, "stopped", retry_delay=1.0)])
        assert {released, failed} <= heard(watch, {released, failed})
    assert store.get(released).state is store.get(failed).state is JobState.CANCELLED


def test_the_reaper_dead_lettering_wakes_the_watch(store, clock):
    jid = store.enqueue(job(max_deliveries=1))
    claim(store, lease=1.0)
    clock.advance(2)
    with watching(store) as watch:
        assert store.reap().dead == (jid,)
        assert jid in heard(watch, {jid})


def test_a_batch_past_the_payload_limit_says_re_read_everything(store, engine):
    if engine == "sqlite":
        pytest.skip("a datagram holds the ids of any batch fleetd writes")
    store.enqueue_many([job() for _ in range(PAYLOAD_IDS + 1)])
    leases = [c.lease for c in claim(store, PAYLOAD_IDS + 1)]
    with watching(store) as watch:
        store.ack([ack(lease) for lease in leases])
        assert heard(watch, {-1}) is EVERYTHING  # -1: no id is, so it listens to the end


def test_payloads_name_ids_or_everything():
    assert final_payload((1, 22, 333)) == "1,22,333"
    assert final_payload(tuple(range(PAYLOAD_IDS + 1))) == "*"
    assert parse_payload("1,22,333") == frozenset({1, 22, 333})
    assert parse_payload("*") is EVERYTHING
    assert parse_payload("") is EVERYTHING
    assert parse_payload("7,x") is EVERYTHING


def test_sqlite_a_full_queue_makes_the_waiter_re_read_everything(tmp_path):
    database = str(tmp_path / "q.db")
    watch = LocalFinalWatch(database)
    announcer = FinalAnnouncer(database)
    try:
        for i in range(watch.full + 3):  # more than the socket queues: some are refused
            announcer.announce([i + 1])
        assert announcer._owed  # the waiter is owed what did not fit
        assert watch.wait(1.0) is EVERYTHING  # it found its queue full
        announcer.announce([1000])
        assert watch.wait(1.0) is EVERYTHING  # the owed datagram: re-read everything
        announcer.announce([1001])
        assert watch.wait(1.0) == frozenset({1001})
    finally:
        watch.close()
        announcer.close()


def test_sqlite_an_announcer_with_nobody_waiting_lists_nothing_and_sends_nothing(tmp_path):
    database = str(tmp_path / "q.db")
    announcer = FinalAnnouncer(database)
    try:
        announcer.announce([1, 2])
        assert announcer._targets == [] and announcer._sock is None
        watch = LocalFinalWatch(database)
        announcer.announce([3])
        assert watch.wait(1.0) == frozenset({3})
        watch.close()
        announcer.announce([4])  # the waiter left: dropped at the first send that fails
        assert announcer._targets == []
    finally:
        announcer.close()


def test_sqlite_a_wake_folder_others_can_write_to_is_not_written_to(tmp_path):
    """The folder's name can be foretold: another user may make it first (writable by all),
    with the counter's name a link to a file of ours. Nothing is written through it, and a
    waiter polls instead (it still returns the job once final)."""
    from supervisor.client import Client
    from supervisor.store import open_store
    from supervisor.store.wake import wake_folder

    database = str(tmp_path / "q.db")
    victim = tmp_path / "precious.txt"
    victim.write_bytes(b"keep these bytes\n")
    folder = wake_folder(database)
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # the umask took some
    (folder / "waiters.gen").symlink_to(victim)
    store = open_store(f"sqlite:///{database}")
    waker = store.waker()  # a supervisor on the file: a waiter would register
    try:
        assert store.final_watch() is None  # it polls instead
        jid = store.enqueue(job())
        store.ack([ack(claim(store)[0].lease)])  # the announcer maps nothing either
        client = Client.__new__(Client)
        client.store = store
        assert client.wait(jid, timeout=10).state is JobState.DONE
        assert victim.read_bytes() == b"keep these bytes\n"
        assert not (folder / WAITERS).exists()
    finally:
        waker.close()
        store.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_postgres_a_wait_keeps_its_timeout_while_an_ending_transaction_is_stuck(store, engine):
    """An ending transaction that took the waiters' lock holds it to its commit; one that
    never commits (its node cut off before its COMMIT) must not hold a waiter past its
    timeout: the waiter gives up on the lock, polls, and is still told when it can be."""
    if engine == "sqlite":
        pytest.skip("PostgreSQL's waiters' lock")
    import threading

    import psycopg

    from supervisor.client import Client
    from supervisor.store.finals import WAITER_STRIPES, WAITERS_LOCK
    from tests.support.databases import postgres_base_url

    jid = store.enqueue(job())
    client = Client.__new__(Client)
    client.store = store
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            client.wait(jid, timeout=0.5)
        except BaseException as exc:  # reported to the test's thread
            outcome.append(exc)

    with psycopg.connect(postgres_base_url()) as stuck:
        for stripe in range(WAITER_STRIPES):  # whichever it took; not committed
            stuck.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", (WAITERS_LOCK, stripe))
        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiter.join(20)  # the promise is 0.5 s; 20 allows for a loaded machine
        assert not waiter.is_alive(), "wait held past its timeout by the waiters' lock"
        stuck.rollback()
    assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError)
    with watching(store) as watch:  # the kept connection still registers once it is free
        store.ack([ack(claim(store)[0].lease)])
        assert jid in heard(watch, {jid})


def test_postgres_acks_while_another_ending_transaction_is_open_rarely_notify(engine):
    """Nobody waits: an ack notifies only when its try collides with another ending
    transaction's, which holds one stripe of the waiters' lock to its commit; two ending at
    once must not make every ack notify (with one lock for all, 3 supervisors acking at once
    notified 40% of their acks). In a database of its own: the lock and channel are per
    database, and other tests' waiters would make every try fail."""
    if engine == "sqlite":
        pytest.skip("PostgreSQL's waiters' lock")
    import uuid

    import psycopg

    from supervisor.store import open_store
    from supervisor.store.finals import FINAL_CHANNEL
    from tests.support.databases import postgres_base_url

    base = postgres_base_url().replace("postgresql+psycopg://", "postgresql://")
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    own = base.rsplit("/", 1)[0] + "/" + name
    store = open_store(own)
    try:
        ids = store.enqueue_many([job() for _ in range(33)])
        leases = [c.lease for c in claim(store, 33)]
        with psycopg.connect(own, autocommit=True) as listener:
            listener.execute(f"LISTEN {FINAL_CHANNEL}")
            with store.engine.connect() as in_flight:  # an ending transaction, not committed
                in_flight.begin()
                store._finals_in_tx(in_flight, [ids[0]])
                for lease in leases[1:]:
                    assert store.ack([ack(lease)]) == []
                in_flight.rollback()
            heard_ = [n.payload for n in listener.notifies(timeout=1.0)]
        # one collision in WAITER_STRIPES (16): about 2 of 32; all 32 with one lock for all
        assert len(heard_) <= 12, f"{len(heard_)} of 32 acks notified with nobody waiting"
    finally:
        store.close()
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_sqlite_a_watch_waits_without_end(tmp_path):
    """Client.wait(timeout=inf, poll=inf) asks a watch to wait for ever: no OverflowError."""
    database = str(tmp_path / "q.db")
    watch = LocalFinalWatch(database)
    announcer = FinalAnnouncer(database)
    try:
        announcer.announce([5])
        assert watch.wait(math.inf) == frozenset({5})
        announcer.announce([6])
        assert watch.wait(1e12) == frozenset({6})
    finally:
        watch.close()
        announcer.close()
