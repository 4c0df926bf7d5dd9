"""Acks and the next claim as one store call (``Store.ack_and_claim``), and the request the
loop sends for both (``storecalls.write_and_claim``): on each engine, the same guarantees as
``ack`` and ``claim_rows`` one after the other."""

from __future__ import annotations

import json

import pytest

from supervisor.errors import StoreRejected, StoreUnavailable
from supervisor.model import (
    Ack,
    ClaimLimits,
    ErrorKind,
    Failure,
    JobState,
    Lease,
    NewJob,
    RetryBudget,
)
from supervisor.run.storecalls import Results, write_and_claim
from supervisor.store.rows import as_claimed
from tests.store.test_caps import counters

LEASE = 30.0
CLAIM = {"pool": "bulk", "kinds": {"render"}, "n": 2, "node": "node-a", "lease": LEASE}
REFUSED = '"\ud800"'  # a lone surrogate: no driver can encode it (StoreRejected)


def job(priority: int = 0, tenant: str | None = None) -> NewJob:
    return NewJob("render", "bulk", json.dumps({"n": 1}), 3, priority=priority, tenant=tenant)


def claimed(store, n: int = 2) -> list:
    return store.claim(pool="bulk", kinds={"render"}, n=n, node="node-a", lease=LEASE)


def test_acks_then_a_claim_in_one_call(store, clock):
    ids = store.enqueue_many([job(), job(), job(), job(priority=5)])
    a, b = claimed(store)  # the priority job and the oldest
    lost, rows = store.ack_and_claim(
        [Ack(a.lease, '{"ok": 1}', peak_rss=10, duration=0.5), Ack(b.lease, '"b"')], **CLAIM
    )
    assert lost == []
    assert {a.job_id, b.job_id} == {ids[3], ids[0]}
    done = store.get(a.job_id)
    assert done.state is JobState.DONE and done.result == {"ok": 1} and done.peak_rss == 10
    assert done.finished_at == clock.now() and store.get(b.job_id).result == "b"
    got = [as_claimed(r) for r in rows]
    assert [c.job_id for c in got] == [ids[1], ids[2]]  # in claim order
    for c in got:
        row = store.get(c.job_id)
        assert row.state is JobState.LEASED and row.attempts == 1 == c.attempt
        assert row.locked_until == clock.now() + LEASE == c.locked_until


def test_a_stale_ack_is_reported_changes_nothing_and_the_claim_is_left_to_the_caller(store):
    ids = store.enqueue_many([job(), job(), job()])
    a, b = claimed(store)
    stale = Lease(b.job_id, "not-the-token")
    lost, rows = store.ack_and_claim([Ack(a.lease, '"a"'), Ack(stale, '"forged"')], **CLAIM)
    assert lost == [stale] and rows is None  # the acks redone the slow way, no claim made
    assert store.get(a.job_id).state is JobState.DONE
    row = store.get(b.job_id)
    assert row.state is JobState.LEASED and row.result is None
    assert store.get(ids[2]).state is JobState.QUEUED


def test_a_fair_pool_claims_in_the_transaction_while_one_tenant_is_queued(store):
    fair = ClaimLimits()  # fair by default: the plain claim, guarded
    ids = store.enqueue_many([job(tenant="a") for _ in range(4)])
    a, b = claimed(store)
    lost, rows = store.ack_and_claim([Ack(a.lease), Ack(b.lease)], **CLAIM, limits=fair)
    assert lost == [] and [r[0] for r in rows] == ids[2:]
    store.enqueue_many([job(tenant="a"), job(tenant="b")])
    c, d = (as_claimed(r) for r in rows)
    store._one_tenant_at.clear()  # the guard runs again (it would after fair.GUARD_EVERY)
    lost, rows = store.ack_and_claim([Ack(c.lease), Ack(d.lease)], **CLAIM, limits=fair)
    assert lost == [] and rows is None  # two tenants: the fair claim is the caller's
    assert store.get(c.job_id).state is JobState.DONE is store.get(d.job_id).state
    got = store.claim_rows(**CLAIM, limits=fair)
    assert {store.get(r[0]).tenant for r in got} == {"a", "b"}
    with pytest.raises(ValueError):  # a capped claim never shares the acks' transaction
        store.ack_and_claim([], **CLAIM, limits=ClaimLimits(max_inflight=5))


def test_a_refused_result_writes_nothing_and_claims_nothing(store):
    store.enqueue_many([job(), job(), job()])
    a, b = claimed(store)
    with pytest.raises(StoreRejected):
        store.ack_and_claim([Ack(a.lease, '"a"'), Ack(b.lease, REFUSED)], **CLAIM)
    assert store.get(a.job_id).state is JobState.LEASED  # one transaction: both undone
    assert store.stats(["bulk"])["bulk"].ready == 1


def test_its_claim_counts_deliveries_in_the_pools_budget(store):
    store.enqueue_many([job() for _ in range(8)])
    a, b = claimed(store)
    store.ack_and_claim([Ack(a.lease), Ack(b.lease)], **CLAIM, budget=RetryBudget(0.1))
    assert counters(store)["deliveries"] == 2
    c, d = claimed(store)
    stale = Lease(c.job_id, "stale")  # the slow way: no claim made, none counted
    store.ack_and_claim([Ack(stale), Ack(d.lease)], **CLAIM, budget=RetryBudget(0.1))
    assert counters(store)["deliveries"] == 2


def test_without_acks_or_with_nothing_to_claim_it_acks_alone(store):
    (jid,) = store.enqueue_many([job()])
    assert store.ack_and_claim([], **CLAIM) == ([], None)
    (a,) = claimed(store)
    assert store.ack_and_claim([Ack(a.lease)], **(CLAIM | {"n": 0})) == ([], None)
    assert store.get(jid).state is JobState.DONE


# ---- the request: storecalls.write_and_claim -------------------------------------------------


def ack_row(c, result: str = '"ok"') -> tuple:
    return ("bulk", c.job_id, c.lease.token, result, None, None)


def test_the_request_writes_then_claims(store):
    ids = store.enqueue_many([job(), job(), job(), job()])
    a, b = claimed(store)
    out = write_and_claim(store, Results([ack_row(a), ack_row(b)]), **CLAIM)
    assert out.claim_error is None and out.written.error is None and not out.written.lost_acks
    assert [r[0] for r in out.rows] == ids[2:]
    assert store.get(a.job_id).state is JobState.DONE is store.get(b.job_id).state


def test_the_request_claims_a_mixed_fair_pool_in_the_fair_order(store):
    store.enqueue_many([job(tenant="a"), job(tenant="a"), job(tenant="a"), job(tenant="b")])
    a, b = claimed(store)
    out = write_and_claim(store, Results([ack_row(a), ack_row(b)]), **CLAIM, limits=ClaimLimits())
    assert out.claim_error is None and not out.written.lost_acks
    assert {store.get(r[0]).tenant for r in out.rows} == {"a", "b"}
    assert store.get(a.job_id).state is JobState.DONE


def test_a_refused_result_fails_alone_and_the_claim_still_runs(store):
    ids = store.enqueue_many([job(), job(), job()])
    a, b = claimed(store)
    out = write_and_claim(store, Results([ack_row(a), ack_row(b, REFUSED)]), **CLAIM)
    assert [row for row, _ in out.written.refused_acks] == [ack_row(b, REFUSED)]
    assert store.get(a.job_id).state is JobState.DONE
    assert store.get(b.job_id).state is JobState.LEASED  # its failure is the loop's to write
    assert out.claim_error is None and [r[0] for r in out.rows] == [ids[2]]


def test_failures_and_releases_are_written_before_the_claim(store):
    ids = store.enqueue_many([job(), job(), job()])
    a, b = claimed(store)
    todo = Results([], [("bulk", Failure(a.lease, ErrorKind.EXCEPTION, "x", 0.0))], [b.lease])
    out = write_and_claim(store, todo, **(CLAIM | {"n": 3}))
    assert out.written.released == [b.job_id] and out.written.failed[0][1].retried == (a.job_id,)
    assert sorted(r[0] for r in out.rows) == sorted(ids)  # what they gave back, claimed again


def test_a_store_away_writes_nothing_claims_nothing_and_keeps_the_results(store, monkeypatch):
    store.enqueue_many([job(), job(), job()])
    a, b = claimed(store)

    def away(*args, **kwargs):
        raise StoreUnavailable("database is locked")

    for verb in ("ack_and_claim", "ack", "claim_rows"):
        monkeypatch.setattr(store, verb, away)
    todo = Results([ack_row(a), ack_row(b)])
    out = write_and_claim(store, todo, **CLAIM)
    assert isinstance(out.claim_error, StoreUnavailable) and out.rows == []
    assert isinstance(out.written.error, StoreUnavailable)
    assert out.written.unwritten.acks == todo.acks  # written again later, by the loop
    monkeypatch.undo()
    assert store.get(a.job_id).state is JobState.LEASED
    assert store.stats(["bulk"])["bulk"].ready == 1
