"""Rate limits (``Store.claim_rated``): the token buckets in the database, on SQLite and on
PostgreSQL (the ``store`` fixture), with the FakeClock as the claim's clock on both."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from supervisor.model import Ack, ClaimLimits, JobState, NewJob, RetryBudget
from supervisor.rates import Bucket, RateLimit
from supervisor.store.claim import ClaimRequest

TEN = RateLimit(Bucket(10.0, 10.0))


def job(kind: str = "render", tenant: str | None = None) -> NewJob:
    return NewJob(kind=kind, pool="bulk", payload=json.dumps({}), max_deliveries=3, tenant=tenant)


def claim(store, n, rate=TEN, kinds=("render",), node="node-a", limits=None, budget=None):
    request = ClaimRequest("bulk", set(kinds), n, node, 30.0, limits, budget)
    return store.claim_rated(request, rate)


def test_a_claim_takes_at_most_the_whole_tokens_and_says_when_the_next_is_due(store, clock):
    store.enqueue_many([job() for _ in range(30)])
    first = claim(store, 20)
    assert len(first.rows) == 10, "a new bucket starts full: the burst"
    assert first.held and first.wait == pytest.approx(0.1)
    empty = claim(store, 20, node="node-b")
    assert empty.rows == [] and empty.held, "another node spends the same bucket"
    assert empty.wait == pytest.approx(0.1)
    clock.advance(0.25)
    assert len(claim(store, 20).rows) == 2
    clock.advance(60.0)
    assert len(claim(store, 20).rows) == 10, "a bucket never holds more than its burst"
    jobs = store.list_jobs(limit=100)
    leased = [j for j in jobs if j.state is JobState.LEASED]
    waiting = [j for j in jobs if j.state is JobState.QUEUED]
    assert len(leased) == 22 and len(waiting) == 8
    assert {j.attempts for j in waiting} == {0}, "a job held by the rate spends no delivery"


def test_a_claim_of_k_jobs_spends_k_tokens_and_fewer_jobs_leave_tokens(store, clock):
    store.enqueue_many([job() for _ in range(3)])
    got = claim(store, 8)
    assert len(got.rows) == 3 and not got.held and got.wait is None
    tokens, at = store.rate_levels("bulk")[""]
    assert tokens == pytest.approx(7.0) and at == pytest.approx(clock.now())
    store.enqueue_many([job() for _ in range(20)])
    assert len(claim(store, 20).rows) == 7


def test_released_jobs_do_not_refund_tokens(store, clock):
    store.enqueue_many([job() for _ in range(20)])
    got = claim(store, 10).rows
    store.release([r.lease for r in map(_claimed, got)])
    again = claim(store, 10)
    assert again.rows == [] and again.held
    clock.advance(0.1)
    assert len(claim(store, 10).rows) == 1


def test_an_empty_queue_is_not_held_by_the_rate(store, clock):
    assert claim(store, 5) == ([], None, {}, False)
    store.enqueue_many([job() for _ in range(11)])
    claim(store, 10)
    out = claim(store, 10)
    assert out.held, "ready jobs and no token"
    store.enqueue(NewJob("mail", "bulk", "{}", 3))
    clock.advance(1.0)
    assert len(claim(store, 10, kinds=("mail",)).rows) == 1
    drained = claim(store, 10, kinds=("mail",))
    assert drained.rows == [] and not drained.held, "no ready job of the kinds claimed"


def test_a_kind_limit_holds_alongside_the_pool_and_leaves_other_kinds_alone(store, clock):
    store.enqueue_many([job("enrich") for _ in range(10)] + [job("render") for _ in range(10)])
    rate = RateLimit(Bucket(100.0, 100.0), {"enrich": Bucket(2.0, 2.0)})
    kinds = ("enrich", "render")
    first = claim(store, 8, rate, kinds)
    assert Counter(_kind(r) for r in first.rows) == {"enrich": 2, "render": 6}
    assert first.kind_waits == {"enrich": pytest.approx(0.5)} and first.wait is None
    second = claim(store, 8, rate, kinds)
    assert Counter(_kind(r) for r in second.rows) == {"render": 4}
    third = claim(store, 8, rate, kinds)
    assert third.rows == [] and third.held, "the enrich jobs wait on their kind's rate"
    clock.advance(0.5)
    assert Counter(_kind(r) for r in claim(store, 8, rate, kinds).rows) == {"enrich": 1}
    assert set(store.rate_levels("bulk")) == {"", "enrich"}


def test_a_kind_limit_inside_a_capped_pool_takes_the_lower_of_cap_and_tokens(store, clock):
    store.enqueue_many([job("enrich", tenant=f"t{i % 3}") for i in range(12)])
    rate = RateLimit(None, {"enrich": Bucket(5.0, 5.0)})
    capped = ClaimLimits(max_inflight=3)
    got = claim(store, 10, rate, ("enrich",), limits=capped)
    assert len(got.rows) == 3, "the pool cap binds first"
    assert {_tenant(r) for r in got.rows} == {"t0", "t1", "t2"}, "still fair between tenants"
    store.ack([_claimed(r).lease and Ack(_claimed(r).lease) for r in got.rows])
    assert len(claim(store, 10, rate, ("enrich",), limits=capped).rows) == 2, "tokens bind"


def test_the_retry_budget_counts_rate_limited_deliveries(store, clock):
    store.enqueue_many([job() for _ in range(4)])
    got = claim(store, 4, budget=RetryBudget(0.1))
    assert len(got.rows) == 4
    # the budget's counters are the budget's own tests'; here the claim must not fail with it
    assert {j.attempts for j in store.list_jobs(limit=10)} == {1}


def _claimed(row):
    from supervisor.run.storecalls import claimed_job

    return claimed_job(row)


def _kind(row) -> str:
    return _claimed(row).kind


def _tenant(row) -> str | None:
    return _claimed(row).tenant


def test_a_claim_whose_clock_reads_earlier_than_the_last_count_refills_nothing_twice(store, clock):
    """A claim's "now" can read earlier than the bucket's last count: a wall clock stepped
    back, or, on PostgreSQL, ``now()`` (the transaction's start) of a claim that waited for
    the pool's lock while another host's claim counted later. The bucket keeps its later
    count: the seconds between are refilled once, not again by the next claim."""
    one = RateLimit(Bucket(1.0, 2.0))
    counted = clock.now()
    clock._now = counted - 1.0
    store.enqueue_many([job() for _ in range(10)])  # ready before the clock's step back
    clock._now = counted
    assert len(claim(store, 1, rate=one).rows) == 1  # a new bucket: 2 tokens, 1 left
    clock._now -= 1.0  # the clock steps back a second
    assert len(claim(store, 1, rate=one).rows) == 1  # the last token: 0 left
    tokens, at = store.rate_levels("bulk")[""]
    assert tokens == pytest.approx(0.0) and at == pytest.approx(counted)
    clock._now = counted  # back where the bucket was last counted: no time has passed
    assert claim(store, 1, rate=one).rows == [], "3 jobs started where the burst is 2"


def test_a_rated_fair_claim_leaves_this_node_s_unwritten_results_out_of_the_fair_order(store):
    """As the plain fair claim (test_fair_share.py): a claim sent in the same pass as results
    of the same node runs before they are written, and ``finished`` says which of the leased
    jobs have ended. A rate-limited pool takes the fair order on every claim; its claim once
    dropped ``finished``, so a tenant whose job had just ended still counted as running."""
    fair = ClaimLimits(fair=True)
    store.enqueue_many([job(tenant="big") for _ in range(10)])
    store.enqueue_many([job(tenant="small") for _ in range(3)])
    assert [r[8] for r in claim(store, 2, limits=fair).rows] == ["big", "small"]
    one = ClaimRequest("bulk", {"render"}, 1, "node-a", 30.0, fair, None, {"small": 1})
    # small's job ended here: small runs none, its next job goes first (without finished:
    # one each running, big's turn)
    assert [r[8] for r in store.claim_rated(one, TEN).rows] == ["small"]
