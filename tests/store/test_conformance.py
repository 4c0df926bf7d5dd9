"""The Store conformance suite: every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import select
import time

import pytest

from supervisor.clock import FakeClock
from supervisor.errors import JobNotFound, NotDead, StoreError
from supervisor.model import Ack, ErrorKind, Failure, JobState, Lease, NewJob
from supervisor.store import open_store
from supervisor.store.rows import BATCH
from tests.support.databases import postgres_schema_url


def job(kind: str = "render", pool: str = "bulk", **kw) -> NewJob:
    kw.setdefault("payload", json.dumps({"n": 1}))
    kw.setdefault("max_deliveries", 3)
    return NewJob(kind=kind, pool=pool, **kw)


def claim(store, n: int = 1, pool: str = "bulk", kinds=("render",), lease: float = 30.0):
    return store.claim(pool=pool, kinds=set(kinds), n=n, node="node-a", lease=lease)


# ---- enqueue --------------------------------------------------------------------------


def test_enqueue_many_returns_ids_in_order_and_stores_fields(store, clock):
    ids = store.enqueue_many(
        [job(payload='{"a": 1}', tenant="acme", priority=5), job(payload='{"a": 2}')]
    )
    assert ids == sorted(ids) and len(set(ids)) == 2
    first = store.get(ids[0])
    assert first.payload == {"a": 1} and first.tenant == "acme" and first.priority == 5
    assert first.state is JobState.QUEUED and first.attempts == 0 and first.pool == "bulk"
    assert first.enqueued_at == clock.now() == first.available_at
    assert store.get(ids[1]).payload == {"a": 2}


def test_every_enqueue_path_wakes_waiting_supervisors_with_the_pool(store):
    # one job (PostgreSQL: one statement, its insert and NOTIFY together), a keyed one, a batch
    waker = store.waker()
    try:
        for enqueue, pool in (
            (lambda: store.enqueue(job(pool="solo")), "solo"),
            (lambda: store.enqueue(job(pool="keyed", key="k")), "keyed"),
            (lambda: store.enqueue_many([job(pool="batch"), job(pool="batch")]), "batch"),
        ):
            enqueue()
            heard: set[str] = set()
            deadline = time.monotonic() + 5
            while pool not in heard and time.monotonic() < deadline:
                select.select([waker.fileno()], [], [], 0.1)
                heard |= waker.drain()
            assert pool in heard
    finally:
        waker.close()


def test_key_is_idempotent_per_kind(store):
    a = store.enqueue(job(key="doc-42", payload='{"v": 1}'))
    b = store.enqueue(job(key="doc-42", payload='{"v": 2}', priority=9))
    c = store.enqueue(job(kind="thumb", key="doc-42"))
    assert a == b != c
    assert store.get(a).payload == {"v": 1} and store.get(a).priority == 0


def test_key_repeated_inside_one_batch_gets_one_job(store):
    ids = store.enqueue_many([job(key="k1"), job(), job(key="k1"), job(key="k2")])
    assert ids[0] == ids[2] and len(set(ids)) == 3


def test_delay_hides_a_job_until_due(store, clock):
    jid = store.enqueue(job(delay=10))
    assert claim(store) == []
    clock.advance(10)
    assert [c.job_id for c in claim(store)] == [jid]


# ---- claim ----------------------------------------------------------------------------


def test_claim_orders_by_priority_then_age(store, clock):
    low = store.enqueue(job(priority=0))
    clock.advance(1)
    high = store.enqueue(job(priority=5))
    clock.advance(1)
    low2 = store.enqueue(job(priority=0))
    assert [c.job_id for c in claim(store, n=3)] == [high, low, low2]


def test_claim_sets_the_lease_and_counts_a_delivery(store, clock):
    jid = store.enqueue(job())
    (c,) = claim(store, lease=30)
    assert c.attempt == 1 and c.locked_until == clock.now() + 30 and len(c.lease.token) >= 16
    row = store.get(jid)
    assert row.state is JobState.LEASED and row.owner == "node-a" and row.attempts == 1
    assert row.started_at == clock.now()
    assert claim(store) == []  # a leased job is not claimed twice


def test_claim_respects_pool_kinds_and_n(store):
    store.enqueue_many([job(), job(), job(kind="thumb"), job(pool="other", kind="x")])
    assert len(claim(store, n=1)) == 1
    assert [c.kind for c in claim(store, n=10, kinds=("thumb",))] == ["thumb"]
    assert len(claim(store, n=10)) == 1
    assert claim(store, n=10, kinds=()) == []
    assert [c.pool for c in claim(store, pool="other", kinds=("x",))] == ["other"]


# ---- extend, ack ----------------------------------------------------------------------


def test_extend_pushes_expiry_and_reports_lost_leases(store, clock):
    store.enqueue_many([job(), job()])
    a, b = claim(store, n=2, lease=10)
    clock.advance(5)
    forged = Lease(b.job_id, "not-the-token")
    assert store.extend([a.lease, forged], lease=10) == [forged]
    row = store.get(a.job_id)
    assert row.locked_until == clock.now() + 10 and row.extensions == 1
    assert store.get(b.job_id).locked_until == b.locked_until


def test_ack_marks_done_and_a_stale_ack_changes_nothing(store, clock):
    store.enqueue_many([job(), job()])
    a, b = claim(store, n=2, lease=10)
    stale = Lease(b.job_id, "stale")
    lost = store.ack([Ack(a.lease, '{"ok": true}', peak_rss=1234, duration=0.5), Ack(stale)])
    assert lost == [stale]
    done = store.get(a.job_id)
    assert done.state is JobState.DONE and done.result == {"ok": True}
    assert done.peak_rss == 1234 and done.duration == 0.5 and done.finished_at == clock.now()
    assert store.get(b.job_id).state is JobState.LEASED
    assert store.ack([Ack(a.lease, '"again"')]) == [a.lease]  # no second completion
    assert store.get(a.job_id).result == {"ok": True}


def test_late_ack_after_takeover_is_lost(store, clock):
    jid = store.enqueue(job())
    (first,) = claim(store, lease=5)
    clock.advance(6)
    assert store.reap().requeued == (jid,)
    (second,) = claim(store, lease=5)
    assert second.attempt == 2 and second.lease.token != first.lease.token
    assert store.ack([Ack(first.lease, '"late"')]) == [first.lease]
    assert store.extend([first.lease], lease=5) == [first.lease]
    assert store.get(jid).state is JobState.LEASED
    assert store.ack([Ack(second.lease, '"mine"')]) == []
    assert store.get(jid).result == "mine"


# ---- fail, release, reap --------------------------------------------------------------


def test_fail_retries_after_the_delay_then_dead_letters_at_the_limit(store, clock):
    jid = store.enqueue(job(max_deliveries=2))
    (c,) = claim(store)
    out = store.fail([Failure(c.lease, ErrorKind.EXCEPTION, "ValueError: x", retry_delay=4)])
    assert out.retried == (jid,) and not out.dead and not out.lost
    row = store.get(jid)
    assert row.state is JobState.QUEUED and row.available_at == clock.now() + 4
    assert row.error_kind is ErrorKind.EXCEPTION and row.last_error == "ValueError: x"
    assert claim(store) == []
    clock.advance(4)
    (c2,) = claim(store)
    out = store.fail([Failure(c2.lease, ErrorKind.MEMORY_LIMIT, "peak 300MiB", retry_delay=4)])
    assert out.dead == (jid,)
    row = store.get(jid)
    assert row.state is JobState.DEAD and row.attempts == 2 and row.finished_at == clock.now()


def test_permanent_failure_dead_letters_at_once(store):
    jid = store.enqueue(job(max_deliveries=5))
    (c,) = claim(store)
    out = store.fail([Failure(c.lease, ErrorKind.PERMANENT, "no doc", retry_delay=None)])
    assert out.dead == (jid,) and store.get(jid).attempts == 1


def test_fail_with_a_lost_lease_changes_nothing(store):
    jid = store.enqueue(job())
    assert len(claim(store)) == 1
    forged = Lease(jid, "forged")
    out = store.fail([Failure(forged, ErrorKind.CRASHED, "signal 9", retry_delay=0)])
    assert out.lost == (forged,) and store.get(jid).state is JobState.LEASED


def test_release_hands_back_at_once_without_counting(store, clock):
    jid = store.enqueue(job())
    clock.advance(1)
    (c,) = claim(store)
    clock.advance(3)
    assert store.release([c.lease, Lease(jid + 1000, "x")]) == [jid]
    row = store.get(jid)
    assert row.state is JobState.QUEUED and row.attempts == 0 and row.available_at == clock.now()
    assert store.release([c.lease]) == []  # second release: no longer ours
    assert [x.attempt for x in claim(store)] == [1]


def test_leases_past_one_statements_batch_are_extended_acked_and_released(store, clock):
    """A host may hold thousands of leases (pipelines and the buffer ahead): extend, the ack's
    ownership check and release go a statement per ``BATCH`` (PostgreSQL binds at most 65,535
    values a statement, SQLite's default build 32,766), and what they return spans them."""
    n = 2 * BATCH + 7
    store.enqueue_many([job() for _ in range(n)])
    held = claim(store, n=n, lease=10)
    assert len(held) == n
    clock.advance(5)
    forged = Lease(held[-1].job_id, "not-the-token")
    assert store.extend([*(c.lease for c in held), forged], lease=10) == [forged]
    assert all(store.get(c.job_id).extensions == 1 for c in (held[0], held[BATCH], held[-1]))
    acked, released = held[: BATCH + 3], held[BATCH + 3 :]
    stale = Ack(Lease(released[0].job_id, "stale"))  # makes the ack check every lease
    assert store.ack([*(Ack(c.lease) for c in acked), stale]) == [stale.lease]
    assert store.get(acked[-1].job_id).state is JobState.DONE
    assert store.release([c.lease for c in released]) == sorted(c.job_id for c in released)
    assert store.get(released[-1].job_id).state is JobState.QUEUED


def test_reap_requeues_expired_leases_and_dead_letters_at_the_limit(store, clock):
    a, b, c = store.enqueue_many([job(max_deliveries=1), job(max_deliveries=2), job()])
    claimed = {x.job_id: x for x in claim(store, n=3, lease=10)}
    clock.advance(5)
    store.extend([claimed[c].lease], lease=20)
    assert store.reap().count == 0
    clock.advance(6)
    out = store.reap()
    assert out.dead == (a,) and out.requeued == (b,)
    for jid in (a, b):
        row = store.get(jid)
        assert row.error_kind is ErrorKind.LEASE_EXPIRED and "node-a" in row.last_error
    assert store.get(c).state is JobState.LEASED


# ---- dead letters, prune, stats, nodes ------------------------------------------------


def _dead(store, n: int) -> list[int]:
    ids = store.enqueue_many([job(kind="bad") for _ in range(n)])
    for c in claim(store, n=n, kinds=("bad",)):
        store.fail([Failure(c.lease, ErrorKind.PERMANENT, "bad", retry_delay=None)])
    return ids


def test_dlq_list_requeue_and_purge(store):
    ids = _dead(store, 3)
    assert [j.id for j in store.dlq_list()] == ids
    assert store.dlq_requeue([ids[0]]) == [ids[0]]
    row = store.get(ids[0])
    assert row.state is JobState.QUEUED and row.attempts == 0
    assert store.dlq_purge([ids[1]]) == [ids[1]] and store.get(ids[1]) is None
    assert store.dlq_requeue() == [ids[2]]
    assert store.dlq_list() == []


def test_dlq_refuses_jobs_that_are_not_dead_and_changes_nothing(store):
    dead = _dead(store, 1)[0]
    alive = store.enqueue(job())
    with pytest.raises(NotDead, match=str(alive)):
        store.dlq_requeue([dead, alive])
    with pytest.raises(JobNotFound, match="99999"):
        store.dlq_purge([dead, 99999])
    assert store.get(dead).state is JobState.DEAD


def test_prune_deletes_only_old_done_jobs(store, clock):
    old, young, queued = store.enqueue_many([job(), job(), job()])
    a, b = claim(store, n=2)
    store.ack([Ack(a.lease)])
    clock.advance(100)
    store.ack([Ack(b.lease)])
    clock.advance(10)
    assert store.prune(older_than=50) == 1
    assert store.get(old) is None and store.get(young) is not None
    assert store.get(queued) is not None


def test_stats_per_pool(store, clock):
    store.enqueue_many([job(), job(), job(delay=60), job(pool="other", kind="x")])
    clock.advance(7)
    store.enqueue(job())
    (c,) = claim(store)
    store.ack([Ack(c.lease)])
    _dead(store, 1)
    st = store.stats(["bulk", "other", "empty"])
    bulk = st["bulk"]
    assert (bulk.ready, bulk.scheduled, bulk.leased, bulk.done, bulk.dead) == (2, 1, 0, 1, 1)
    assert bulk.oldest_ready_age == pytest.approx(7.0)
    assert st["other"].ready == 1 and st["empty"].ready == 0
    assert st["empty"].oldest_ready_age == 0.0


def test_nodes_register_heartbeat_and_list(store, clock):
    store.register_node(node_id="h1-1", hostname="h1", pid=1, fleet="f")
    clock.advance(3)
    store.node_heartbeat("h1-1", state="draining", snapshot='{"x": 1}')
    clock.advance(2)
    (node,) = store.list_nodes()
    assert node["state"] == "draining" and node["snapshot"] == '{"x": 1}'
    assert node["age"] == pytest.approx(2.0)


def test_reopen_keeps_data_and_migrations_are_idempotent(store, db_url, clock):
    jid = store.enqueue(job())
    again = open_store(db_url, clock)
    try:
        assert again.get(jid) is not None and again.migrate() == store.migrate()
    finally:
        again.close()


def test_a_newer_schema_is_refused(store, db_url):
    from sqlalchemy import insert

    from supervisor.store.schema import schema_version

    with store.engine.begin() as conn:
        conn.execute(insert(schema_version).values(version=999, applied_at=0))
    with pytest.raises(StoreError, match="newer than this fleetd knows"):
        open_store(db_url)


@pytest.mark.postgres
def test_postgres_uses_database_time():
    with postgres_schema_url() as url:
        s = open_store(url)  # no injected clock: the database's now() is the clock
        try:
            s.enqueue(job())
            (c,) = claim(s, lease=30)
            assert c.locked_until - s.now() == pytest.approx(30, abs=2)
        finally:
            s.close()


def test_unreachable_or_bad_urls_raise_one_line_errors(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/missing/x.db")
    with pytest.raises(StoreError, match="in-memory"):
        open_store("sqlite:///:memory:")
    with pytest.raises(StoreError, match="not a database URL"):
        open_store("nonsense")
    with pytest.raises(StoreError, match="cannot open database") as err:
        open_store("postgresql://nobody@127.0.0.1:1/none")
    assert "\n" not in str(err.value)


def test_fake_clock_cannot_go_back():
    with pytest.raises(ValueError):
        FakeClock().advance(-1)


def test_history_counts_recent_completions_with_durations_and_peaks(store, clock):
    store.enqueue_many([job() for _ in range(4)])
    first = claim(store, n=2)
    store.ack([Ack(c.lease, peak_rss=100 * (i + 1), duration=0.5) for i, c in enumerate(first)])
    clock.advance(100)
    rest = claim(store, n=2)
    store.ack([Ack(rest[0].lease, peak_rss=900, duration=2.0)])
    store.ack([Ack(rest[1].lease)])  # no figures reported
    recent = store.history("bulk", window=50)
    assert recent.completed == 2 and recent.durations == (2.0,) and recent.peaks == (900,)
    everything = store.history("bulk", window=500)
    assert everything.completed == 4 and sorted(everything.peaks) == [100, 200, 900]
    assert store.history("other", window=500).completed == 0


def test_stats_counts_stop_at_the_cap(store, clock, monkeypatch):
    import supervisor.store.reads as reads

    monkeypatch.setattr(reads, "STATS_CAP", 5)
    store.enqueue_many([job() for _ in range(8)])
    clock.advance(3)
    bulk = store.stats(["bulk"])["bulk"]
    assert bulk.ready == 5 and bulk.capped and bulk.oldest_ready_age == pytest.approx(3.0)
    small = store.stats(["other"])["other"]
    assert small.ready == 0 and not small.capped


# ---- operator controls: cancel, pause, bulk filters (supervisor/store/controls.py) -------


def test_cancel_a_queued_job_at_once_and_it_is_never_claimed(store, clock):
    first, waiting = store.enqueue_many([job(), job(delay=60)])
    out = store.cancel([first, waiting])  # waiting: a job between retries looks the same
    assert out.cancelled == (first, waiting) and not out.requested and not out.unchanged
    assert {store.get(i).state for i in (first, waiting)} == {JobState.CANCELLED}
    assert store.get(first).finished_at == clock.now()
    clock.advance(61)
    assert claim(store, n=5) == []
    assert store.stats(["bulk"])["bulk"].cancelled == 2


def test_cancel_of_a_leased_job_is_requested_and_any_end_makes_it_cancelled(store, clock):
    a, b, c, d = store.enqueue_many([job() for _ in range(4)])
    leases = {x.job_id: x.lease for x in claim(store, n=4, lease=10)}
    out = store.cancel([a, b, c, d])
    assert out.requested == {a: "node-a", b: "node-a", c: "node-a", d: "node-a"}
    assert store.get(a).state is JobState.LEASED and store.get(a).cancel_requested_at
    assert {x.job_id for x in store.controls("node-a").cancels} == {a, b, c, d}
    assert store.controls("node-b").cancels == ()
    # an ack keeps its result, a failure is never retried, a release never requeues, and the
    # reaper of a lost host cancels too
    assert store.ack([Ack(leases[a], result="7")]) == []
    failed = store.fail([Failure(leases[b], ErrorKind.EXCEPTION, "boom", retry_delay=0.0)])
    assert failed.cancelled == (b,) and failed.retried == ()
    assert store.release([leases[c]]) == [c]
    clock.advance(11)
    assert store.reap().count == 1
    rows = {i: store.get(i) for i in (a, b, c, d)}
    assert {r.state for r in rows.values()} == {JobState.CANCELLED}
    assert rows[a].result == 7 and rows[b].attempts == 1 and rows[c].attempts == 0
    assert store.controls("node-a").cancels == ()
    assert claim(store, n=4) == []


def test_cancel_of_final_jobs_changes_nothing_and_says_so(store):
    done, dead = store.enqueue(job()), _dead(store, 1)[0]
    (c,) = claim(store)
    store.ack([Ack(c.lease, result="1")])
    out = store.cancel([done, dead])
    assert not out.took and out.unchanged == {done: JobState.DONE, dead: JobState.DEAD}
    assert store.cancel([done]).unchanged == {done: JobState.DONE}
    with pytest.raises(JobNotFound, match="99999"):
        store.cancel([done, 99999])


def test_cancel_by_filter_touches_only_what_matches(store):
    acme = store.enqueue_many([job(tenant="acme") for _ in range(3)])
    other = store.enqueue_many([job(tenant="other"), job(kind="thumb", tenant="acme")])
    (leased,) = claim(store, n=1)  # acme[0]
    from supervisor.model import JobFilter

    only_queued = JobFilter(kind="render", tenant="acme", states=(JobState.QUEUED,))
    count, found = store.find_jobs(only_queued, [JobState.QUEUED])
    assert count == 2 and [j.id for j in found] == acme[1:]
    out = store.cancel(where=only_queued)
    assert out.cancelled == tuple(acme[1:]) and not out.requested
    out = store.cancel(where=JobFilter(kind="render", tenant="acme"))
    assert out.requested == {leased.job_id: "node-a"} and out.cancelled == ()
    assert store.cancel(where=JobFilter(kind="render", tenant="acme")).took is False
    # the dry run counts what a cancel would touch: not the job asked to stop already
    assert store.find_cancellable(JobFilter(kind="render", tenant="acme")) == (0, [])
    assert store.find_cancellable(JobFilter(tenant="other"))[0] == 1
    done_only = JobFilter(tenant="acme", states=(JobState.DONE,))
    assert store.find_cancellable(done_only) == (0, [])
    assert [store.get(i).state for i in other] == [JobState.QUEUED, JobState.QUEUED]


def test_pause_and_resume_are_stored_and_say_whether_they_took(store):
    assert store.pause("bulk") is True and store.pause("bulk") is False
    assert store.pause("bulk", "render") is True and store.pause("other", "x") is True
    assert [(p.pool, p.kind) for p in store.controls("n").pauses] == [
        ("bulk", None),
        ("bulk", "render"),
        ("other", "x"),
    ]
    assert [(p.pool, p.kind) for p in store.resume("bulk", "render")] == [("bulk", "render")]
    assert [(p.pool, p.kind) for p in store.resume("bulk")] == [("bulk", None)]
    assert store.resume("bulk") == []
    assert [(p.pool, p.kind) for p in store.pauses()] == [("other", "x")]


def test_resume_of_the_pool_wide_pause_alone_keeps_the_kinds_paused(store):
    store.pause("bulk", "render")
    store.pause("bulk")
    store.pause("other")
    lifted = store.resume("bulk", pool_wide_only=True)
    assert [(p.pool, p.kind) for p in lifted] == [("bulk", None)]
    assert [(p.pool, p.kind) for p in store.pauses()] == [("bulk", "render"), ("other", None)]
    assert store.resume("bulk", pool_wide_only=True) == []


def test_cancelled_jobs_are_pruned_after_the_retention(store, clock):
    old = store.enqueue(job())
    store.cancel([old])
    clock.advance(100)
    young = store.enqueue(job())
    store.cancel([young])
    assert store.prune(older_than=50) == 1
    assert store.get(old) is None and store.get(young).state is JobState.CANCELLED


def test_dlq_requeue_and_purge_by_filter(store, clock):
    from supervisor.model import JobFilter

    old = _dead(store, 1)[0]
    clock.advance(3600)
    mem = store.enqueue_many([job(kind="bad", tenant="acme") for _ in range(2)])
    for c in claim(store, n=2, kinds=("bad",)):
        store.fail([Failure(c.lease, ErrorKind.MEMORY_LIMIT, "big", retry_delay=None)])
    recent = JobFilter(kind="bad", error_kind=ErrorKind.MEMORY_LIMIT, since=600)
    assert store.find_jobs(recent, [JobState.DEAD])[0] == 2
    assert store.dlq_requeue(where=JobFilter(since=600, tenant="nobody")) == []
    assert store.dlq_requeue(where=recent) == mem
    assert len(store.dlq_purge(where=JobFilter(error_kind=ErrorKind.PERMANENT))) == 1
    assert store.get(old) is None and store.get(mem[0]).state is JobState.QUEUED
