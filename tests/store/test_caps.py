"""Fleet-wide caps, fair shares between tenants, and the retry budget: conformance tests that run
on SQLite and on PostgreSQL (the ``store`` fixture), with the FakeClock."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from sqlalchemy import select

from supervisor.model import Ack, ClaimLimits, ErrorKind, Failure, JobState, NewJob, RetryBudget
from supervisor.store import fair, open_store
from supervisor.store.budget import DEFERRED
from supervisor.store.schema import BUDGET_BUCKET, retry_budget


def job(kind: str = "render", tenant: str | None = None, **kw) -> NewJob:
    kw.setdefault("payload", json.dumps({}))
    kw.setdefault("max_deliveries", 3)
    return NewJob(kind=kind, pool="bulk", tenant=tenant, **kw)


def claim(store, n, limits=None, kinds=("render",), node="node-a", budget=None):
    return store.claim(
        pool="bulk", kinds=set(kinds), n=n, node=node, lease=30.0, limits=limits, budget=budget
    )


def tenants_of(claimed) -> list[str | None]:
    return [c.tenant for c in claimed]


# ---- caps -------------------------------------------------------------------------------


def test_pool_cap_counts_every_leased_job_of_the_pool(store):
    store.enqueue_many([job() for _ in range(10)])
    cap = ClaimLimits(max_inflight=3)
    first = claim(store, 10, cap)
    assert len(first) == 3
    assert claim(store, 10, cap) == []
    assert claim(store, 10, cap, node="node-b") == [], "another node sees the same count"
    store.ack([Ack(first[0].lease)])
    assert len(claim(store, 10, cap, node="node-b")) == 1
    # leased jobs of another pool do not count
    store.enqueue(NewJob(kind="render", pool="other", payload="{}", max_deliveries=3))
    other = store.claim(pool="other", kinds={"render"}, n=1, node="x", lease=30, limits=cap)
    assert len(other) == 1


def test_tenant_cap_and_jobs_without_a_tenant_share_one(store):
    store.enqueue_many([job(tenant="a") for _ in range(5)] + [job(tenant="b") for _ in range(5)])
    store.enqueue_many([job() for _ in range(3)])
    cap = ClaimLimits(tenant_max_inflight=2)
    got = claim(store, 20, cap)
    assert Counter(tenants_of(got)) == {"a": 2, "b": 2, None: 2}
    assert claim(store, 20, cap) == []
    store.ack([Ack(c.lease) for c in got if c.tenant == "b"][:1])
    assert tenants_of(claim(store, 20, cap)) == ["b"]


def test_kind_cap_limits_only_that_kind(store):
    store.enqueue_many([job("enrich") for _ in range(4)] + [job("render") for _ in range(4)])
    cap = ClaimLimits(kind_max_inflight={"enrich": 1})
    got = claim(store, 6, cap, kinds=("render", "enrich"))
    assert Counter(c.kind for c in got) == {"enrich": 1, "render": 4}
    assert [c.kind for c in claim(store, 6, cap, kinds=("render", "enrich"))] == []
    enrich = next(c for c in got if c.kind == "enrich")
    store.fail([Failure(enrich.lease, ErrorKind.EXCEPTION, "boom", retry_delay=0)])
    assert [c.kind for c in claim(store, 6, cap, kinds=("render", "enrich"))] == ["enrich"]


def test_all_caps_together(store):
    store.enqueue_many(
        [job("enrich", tenant="a") for _ in range(3)]
        + [job("render", tenant="a") for _ in range(3)]
        + [job("render", tenant="b") for _ in range(3)]
    )
    cap = ClaimLimits(max_inflight=3, tenant_max_inflight=2, kind_max_inflight={"enrich": 1})
    got = claim(store, 10, cap, kinds=("render", "enrich"))
    assert len(got) == 3
    assert Counter(tenants_of(got))["a"] <= 2 and Counter(c.kind for c in got)["enrich"] <= 1


def test_capped_claim_skips_delayed_jobs_and_other_kinds(store, clock):
    store.enqueue_many([job(delay=10), job("thumb"), job(tenant="t")])
    got = claim(store, 5, ClaimLimits(max_inflight=5))
    assert tenants_of(got) == ["t"]
    clock.advance(10)
    assert tenants_of(claim(store, 5, ClaimLimits(max_inflight=5))) == [None]


def test_capped_claim_sets_the_lease_like_the_plain_claim(store, clock):
    jid = store.enqueue(job(tenant="t", priority=3))
    (c,) = claim(store, 1, ClaimLimits(max_inflight=1))
    assert c.job_id == jid and c.attempt == 1 and c.locked_until == clock.now() + 30
    assert c.tenant == "t" and len(c.lease.token) >= 16
    row = store.get(jid)
    assert row.state is JobState.LEASED and row.owner == "node-a" and row.started_at == clock.now()
    assert store.ack([Ack(c.lease)]) == []


# ---- fair shares ------------------------------------------------------------------------


def test_each_tenants_first_job_comes_before_any_tenants_second(store, clock):
    store.enqueue_many([job(tenant="big") for _ in range(50)])
    clock.advance(1)
    store.enqueue_many([job(tenant="small", priority=0) for _ in range(2)])
    clock.advance(1)
    store.enqueue_many([job(tenant="mid")])
    got = tenants_of(claim(store, 5, ClaimLimits(max_inflight=10)))
    assert sorted(got[:3]) == ["big", "mid", "small"] and sorted(got[3:]) == ["big", "small"]


def test_a_small_tenant_is_served_while_a_big_backlog_waits(store, clock):
    """The issue's case: a bulk import of many jobs enqueued first, then ten jobs of another
    tenant; one slot at a time frees up. The small tenant gets every other slot."""
    store.enqueue_many([job(tenant="bulk-import") for _ in range(500)])
    clock.advance(1)
    small = set(store.enqueue_many([job(tenant="small") for _ in range(10)]))
    cap = ClaimLimits(max_inflight=3)
    running = claim(store, 3, cap)
    order = list(running)
    while small - {c.job_id for c in order}:
        store.ack([Ack(running[0].lease)])
        running = running[1:]
        (new,) = claim(store, 3, cap)
        order.append(new)
        running.append(new)
    assert len(order) <= 21, "after the first three slots, every other one went to small"
    assert sum(c.tenant == "small" for c in order) == 10


def test_fair_order_follows_what_each_tenant_already_runs(store, clock):
    store.enqueue_many([job(tenant="a") for _ in range(10)])
    clock.advance(1)
    store.enqueue_many([job(tenant="b") for _ in range(10)])
    cap = ClaimLimits(max_inflight=10)
    assert tenants_of(claim(store, 3, cap)) == ["a", "b", "a"]
    # a runs 2, b runs 1: b's 2nd job comes first, then a's 3rd ties with b's 3rd and the
    # round-robin turn goes to a (b was served last)
    assert tenants_of(claim(store, 2, cap)) == ["b", "a"]


def test_priority_orders_within_a_tenant_and_breaks_ties_between_tenants(store, clock):
    a_low = store.enqueue(job(tenant="a", priority=0))
    a_high = store.enqueue(job(tenant="a", priority=9))
    clock.advance(1)
    b_mid = store.enqueue(job(tenant="b", priority=5))
    b_low = store.enqueue(job(tenant="b", priority=0))
    got = claim(store, 4, ClaimLimits(max_inflight=10))
    assert [c.job_id for c in got] == [a_high, b_mid, a_low, b_low]


def test_many_tenants_are_served_round_robin_through_windows(store, monkeypatch):
    monkeypatch.setattr(fair, "WINDOW", 3)
    names = [f"t{i}" for i in range(7)]
    store.enqueue_many([job(tenant=t) for t in names for _ in range(3)])
    cap = ClaimLimits(max_inflight=1)
    served = []
    for _ in range(14):
        (c,) = claim(store, 1, cap)
        served.append(c.tenant)
        store.ack([Ack(c.lease)])
    assert sorted(served[:7]) == names, "every tenant once before any twice"
    assert sorted(served[7:]) == names


def test_tenants_at_their_cap_do_not_take_room_in_the_window(store, monkeypatch):
    monkeypatch.setattr(fair, "WINDOW", 2)
    names = ["a", "b", "c", "d", "e", "f"]
    store.enqueue_many([job(tenant=t) for t in names for _ in range(3)])
    cap = ClaimLimits(tenant_max_inflight=1)
    assert sorted(tenants_of(claim(store, 10, cap))) == ["a", "b"]
    assert sorted(tenants_of(claim(store, 10, cap))) == ["c", "d", "e", "f"]
    assert claim(store, 10, cap) == []


# ---- retry budget -----------------------------------------------------------------------


def counters(store) -> dict[str, int]:
    table = retry_budget.c
    query = select(table.bucket, table.deliveries, table.retries, table.deferred).where(
        table.pool == "bulk"
    )
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    return {
        "buckets": len(rows),
        "deliveries": sum(r.deliveries for r in rows),
        "retries": sum(r.retries for r in rows),
        "deferred": sum(r.deferred for r in rows),
    }


def fail_all(store, claimed, budget, delay=1.0):
    return store.fail(
        [Failure(c.lease, ErrorKind.EXCEPTION, "HTTP 503", delay, budget=budget) for c in claimed]
    )


def test_claims_count_deliveries_only_for_pools_with_a_budget(store):
    store.enqueue_many([job() for _ in range(12)])
    claim(store, 5)
    assert counters(store)["deliveries"] == 0
    budget = RetryBudget(0.1)
    claim(store, 4, budget=budget)
    claim(store, 3, ClaimLimits(max_inflight=50), budget=budget)
    assert counters(store)["deliveries"] == 7


def test_past_the_budget_a_failure_is_deferred_not_retried_or_dropped(store, clock):
    budget = RetryBudget(0.1, floor=2, window=60.0)
    ids = store.enqueue_many([job() for _ in range(30)])
    got = claim(store, 30, budget=budget)  # 30 deliveries: 0.1 × 30 = 3 retries allowed
    out = fail_all(store, got[:5], budget, delay=1.0)
    assert set(out.retried) == {c.job_id for c in got[:5]} and not out.dead
    assert len(out.deferred) == 2 and set(out.deferred) <= set(out.retried)
    rows = {j.id: j for j in (store.get(i) for i in ids[:5])}
    retried_now = [j for j in rows.values() if j.available_at == clock.now() + 1.0]
    deferred = [j for j in rows.values() if j.available_at == clock.now() + 61.0]
    assert len(retried_now) == 3 and len(deferred) == 2
    for j in deferred:
        assert j.state is JobState.QUEUED and j.attempts == 1
        assert j.last_error.startswith("HTTP 503") and DEFERRED in j.last_error
    assert all(j.last_error == "HTTP 503" for j in retried_now)
    assert counters(store) | {"buckets": 0} == {
        "buckets": 0,
        "deliveries": 30,
        "retries": 3,
        "deferred": 2,
    }


def test_failures_that_end_cancelled_spend_nothing_of_the_budget(store, clock):
    budget = RetryBudget(0.1, floor=1, window=60.0)
    store.enqueue_many([job() for _ in range(4)])
    got = claim(store, 4, budget=budget)
    store.cancel([c.job_id for c in got[:3]])  # leased: their cancel is requested
    out = fail_all(store, got, budget)
    assert set(out.cancelled) == {c.job_id for c in got[:3]}
    assert out.retried == (got[3].job_id,) and not out.deferred  # the one retry the floor allows
    assert counters(store)["retries"] == 1 and counters(store)["deferred"] == 0
    assert store.get(got[3].job_id).available_at == clock.now() + 1.0


def test_the_floor_allows_retries_when_deliveries_are_few(store, clock):
    budget = RetryBudget(0.1, floor=2, window=60.0)
    store.enqueue_many([job() for _ in range(3)])
    got = claim(store, 3, budget=budget)
    fail_all(store, got, budget)
    assert counters(store)["retries"] == 2 and counters(store)["deferred"] == 1


def test_the_budget_refills_when_the_window_passes(store, clock):
    budget = RetryBudget(0.1, floor=1, window=30.0)
    store.enqueue_many([job() for _ in range(4)])
    got = claim(store, 2, budget=budget)
    fail_all(store, got, budget)
    assert counters(store)["deferred"] == 1
    clock.advance(30.0 + BUDGET_BUCKET)  # the retry and the deferral have aged out
    got = claim(store, 2, budget=budget)
    out = fail_all(store, got, budget, delay=2.0)
    assert len(out.deferred) == 1 and len(out.retried) == 2
    retried_now = [store.get(c.job_id).available_at == clock.now() + 2.0 for c in got]
    assert sorted(retried_now) == [False, True]


def test_the_budget_is_shared_by_every_host(store, db_url, clock):
    budget = RetryBudget(0.5, floor=1, window=60.0)
    other = open_store(db_url, clock)  # a second host on the same database
    try:
        store.enqueue_many([job() for _ in range(4)])
        a = claim(store, 2, budget=budget)
        b = other.claim(pool="bulk", kinds={"render"}, n=2, node="node-b", lease=30, budget=budget)
        assert counters(store)["deliveries"] == 4  # 0.5 × 4 = 2 retries fleet-wide
        fail_all(store, a, budget)
        fail_all(other, b, budget)
        assert counters(store)["retries"] == 2 and counters(store)["deferred"] == 2
    finally:
        other.close()


def test_last_deliveries_die_and_permanent_failures_ignore_the_budget(store):
    budget = RetryBudget(0.1, floor=0, window=60.0)
    last = store.enqueue(job(max_deliveries=1))
    bad = store.enqueue(job())
    got = {c.job_id: c for c in claim(store, 2, budget=budget)}
    out = store.fail(
        [
            Failure(got[last].lease, ErrorKind.EXCEPTION, "x", 1.0, budget=budget),
            Failure(got[bad].lease, ErrorKind.PERMANENT, "y", None, budget=budget),
        ]
    )
    assert sorted(out.dead) == sorted([last, bad])
    assert counters(store)["retries"] == 0 and counters(store)["deferred"] == 0


def test_a_stale_lease_is_lost_and_not_judged(store, clock):
    budget = RetryBudget(0.1, floor=0, window=60.0)
    store.enqueue(job())
    (c,) = claim(store, 1, budget=budget)
    store.release([c.lease])
    out = fail_all(store, [c], budget)
    assert list(out.lost) == [c.lease]
    assert counters(store)["deferred"] == 0


def test_old_buckets_are_pruned(store, clock):
    budget = RetryBudget(0.1, window=20.0)
    store.enqueue_many([job() for _ in range(5)])
    for _ in range(5):
        claim(store, 1, budget=budget)
        clock.advance(BUDGET_BUCKET)
    assert counters(store)["buckets"] <= 3


@pytest.mark.parametrize(
    "deliveries, retries, allowed",
    [(0, 9, True), (0, 10, False), (300, 29, True), (300, 30, False)],
)
def test_allows_is_max_of_floor_and_ratio(deliveries, retries, allowed):
    assert RetryBudget(0.1).allows(retries, deliveries) is allowed


# ---- migration --------------------------------------------------------------------------


def test_migration_3_upgrades_a_version_2_database(db_url, clock):
    from sqlalchemy import create_engine, inspect, text

    from supervisor.store import migrations, schema

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:  # a database left by the previous release
            dialect = engine.dialect.name
            schema.metadata.create_all(conn, tables=[schema.schema_version])
            migrations._v1_tables(conn, dialect)
            migrations._v2_postgres_vacuum(conn, dialect)
            for version in (1, 2):
                conn.execute(schema.schema_version.insert().values(version=version, applied_at=0))
            conn.execute(text("DROP INDEX ix_jobs_tenant_claim"))  # v1 did not make them
            conn.execute(text("DROP INDEX ix_jobs_leased"))
        assert "fleetd_retry_budget" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
    store = open_store(db_url, clock)
    try:
        with store.engine.connect() as conn:
            names = set(inspect(conn).get_table_names())
            indexes = {
                row[0]
                for row in conn.execute(
                    text("SELECT name FROM sqlite_master WHERE type = 'index'")
                    if conn.dialect.name == "sqlite"
                    else text("SELECT indexname FROM pg_indexes WHERE tablename = 'fleetd_jobs'")
                )
            }
        assert "fleetd_retry_budget" in names
        assert {"ix_jobs_tenant_claim", "ix_jobs_leased"} <= indexes
        store.enqueue(job(tenant="t"))
        assert tenants_of(claim(store, 1, ClaimLimits(max_inflight=1))) == ["t"]
    finally:
        store.close()
