"""Fair share between tenants without caps (``ClaimLimits(fair=True)``, weights) against the
plain priority-then-FIFO claim: conformance tests on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import math
from collections import Counter
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select

from supervisor.model import Ack, ClaimLimits, NewJob, RetryBudget
from supervisor.store import fair
from supervisor.store.schema import jobs as jobs_table
from supervisor.store.schema import retry_budget

FAIR = ClaimLimits()


def job(tenant: str | None = None, kind: str = "render", **kw) -> NewJob:
    kw.setdefault("payload", json.dumps({}))
    kw.setdefault("max_deliveries", 3)
    return NewJob(kind=kind, pool="bulk", tenant=tenant, **kw)


def claim(store, n, limits=FAIR, node="node-a", budget=None):
    return store.claim(
        pool="bulk", kinds={"render"}, n=n, node=node, lease=30.0, limits=limits, budget=budget
    )


def tenants_of(claimed) -> list[str | None]:
    return [c.tenant for c in claimed]


def big_then_small(store) -> None:
    store.enqueue_many([job("big") for _ in range(40)])
    store.enqueue_many([job("small") for _ in range(3)])


def test_a_small_tenant_behind_a_big_backlog_takes_turns(store):
    big_then_small(store)
    order = [t for _ in range(8) for t in tenants_of(claim(store, 2))]
    assert order[:6] == ["big", "small"] * 3
    assert order[6:] == ["big"] * 10


def test_fair_false_and_no_limits_keep_priority_then_fifo(store):
    big_then_small(store)
    fifo = ClaimLimits(fair=False)
    assert tenants_of(claim(store, 40, fifo)) == ["big"] * 40
    assert tenants_of(claim(store, 40, None)) == ["small"] * 3


def test_positions_count_the_leased_jobs_of_every_host(store):
    big_then_small(store)
    first = claim(store, 1, node="node-a")
    assert tenants_of(first) == ["big"]
    # another host's claim sees big's leased job: small goes first
    second = claim(store, 1, node="node-b")
    assert tenants_of(second) == ["small"]
    store.ack([Ack(first[0].lease)])
    assert tenants_of(claim(store, 1, node="node-a")) == ["big"]  # big runs none now
    store.ack([Ack(second[0].lease)])
    assert tenants_of(claim(store, 1, node="node-b")) == ["small"]


def test_weights_share_the_slots(store):
    store.enqueue_many([job("big") for _ in range(20)] + [job("small") for _ in range(20)])
    weighted = ClaimLimits(weights={"big": 3})
    assert Counter(tenants_of(claim(store, 8, weighted))) == {"big": 6, "small": 2}
    # one at a time, the running counts keep the shares: 3 more big, 1 more small
    more = [t for _ in range(4) for t in tenants_of(claim(store, 1, weighted))]
    assert Counter(more) == {"big": 3, "small": 1}


def test_a_light_tenant_is_not_starved_in_a_small_pool(store):
    store.enqueue_many([job("big") for _ in range(10)] + [job("small") for _ in range(10)])
    weighted = ClaimLimits(weights={"big": 3})
    running = claim(store, 2, weighted)
    assert sorted(tenants_of(running)) == ["big", "small"]
    for _ in range(6):  # the heavy tenant's job ends, and then the light one's, in turn
        done = next(c for c in running if c.tenant == "big")
        store.ack([Ack(done.lease)])
        running = [c for c in running if c is not done] + claim(store, 1, weighted)
        assert sorted(tenants_of(running)) == ["big", "small"]


def test_priority_orders_within_a_tenant_and_breaks_ties(store):
    a0, a5, b1 = store.enqueue_many(
        [job("a", priority=0), job("a", priority=5), job("b", priority=1)]
    )
    # a's urgent job first (its first turn ties b's; priority 5 wins), then b's, then a's second
    assert [c.job_id for c in claim(store, 3)] == [a5, b1, a0]


def test_a_huge_backlog_never_holds_back_ten_jobs(store):
    store.enqueue_many([job("big") for _ in range(5000)])
    store.enqueue_many([job("small") for _ in range(10)])
    order = [t for _ in range(10) for t in tenants_of(claim(store, 2))]
    assert order.count("small") == 10


def test_jobs_without_a_tenant_are_one_tenant_of_their_own(store):
    store.enqueue_many([job() for _ in range(6)] + [job("a") for _ in range(2)])
    assert tenants_of(claim(store, 4)) == [None, "a", None, "a"]


def test_one_tenant_claims_with_the_plain_statement(store, clock):
    """A pool whose queue holds one tenant (or none) claims in plain order and keeps its
    round-robin cursor; a pool found mixed goes to the fair claim until one tenant is left."""
    p0, p2, p1 = store.enqueue_many([job("a", priority=p) for p in (0, 2, 1)])
    assert [c.job_id for c in claim(store, 2)] == [p2, p1]
    assert "bulk" not in store._cursors and "bulk" not in store._mixed_pools
    (untenanted,) = store.enqueue_many([job()])
    clock.advance(fair.GUARD_EVERY)
    assert [c.job_id for c in claim(store, 1)] == [untenanted]  # '' runs none, 'a' two
    assert store._cursors.get("bulk") == "" and "bulk" in store._mixed_pools
    store._cursors.clear()
    assert [c.job_id for c in claim(store, 9)] == [p0]  # 'a' alone again
    assert store._cursors.get("bulk") is None and "bulk" not in store._mixed_pools
    assert claim(store, 1) == []  # nothing queued: the guard is false, the probe says so too
    assert store._cursors.get("bulk") is None and "bulk" not in store._mixed_pools


def test_a_second_tenant_arriving_is_ordered_fairly_within_the_guard_interval(store, clock):
    """A claim that found one tenant queued spares the pool's claims its guard for
    ``GUARD_EVERY``: a tenant arriving meanwhile waits that long, then goes first."""
    store.enqueue_many([job("big") for _ in range(10)])
    assert tenants_of(claim(store, 2)) == ["big", "big"]
    store.enqueue_many([job("small") for _ in range(2)])
    clock.advance(fair.GUARD_EVERY / 2)
    assert tenants_of(claim(store, 1)) == ["big"]  # plain order, without the guard
    clock.advance(fair.GUARD_EVERY)  # since the guarded claim: more than GUARD_EVERY
    assert tenants_of(claim(store, 3)) == ["small", "small", "big"]
    assert fair.GUARD_EVERY <= 0.1  # the promise: a tenant is ordered fairly within 0.1 s


def test_an_uncapped_pool_without_fair_never_runs_the_guard(store):
    store.enqueue_many([job("big") for _ in range(4)] + [job("small")])
    assert tenants_of(claim(store, 2, None)) == ["big", "big"]
    assert "bulk" not in store._one_tenant_at and "bulk" not in store._mixed_pools


def test_the_fair_claim_counts_deliveries_in_the_retry_budget(store):
    big_then_small(store)
    budget = RetryBudget(0.5)
    assert len(claim(store, 4, budget=budget)) == 4
    assert len(claim(store, 4, ClaimLimits(weights={"big": 2}), budget=budget)) == 4
    with store.engine.connect() as conn:
        rows = conn.execute(select(retry_budget.c.deliveries)).scalars().all()
    assert sum(rows) == 8


def test_the_probe_reads_the_whole_queue(store):
    """Delayed jobs of another tenant count: the fair claim runs and takes what is ready."""
    store.enqueue_many([job("a") for _ in range(3)] + [job("b", delay=60)])
    with store.engine.connect() as conn:
        assert store._mixed(conn, "bulk")
    assert tenants_of(claim(store, 5)) == ["a", "a", "a"]
    assert fair.WINDOW >= 2


def test_results_not_written_yet_do_not_count_as_running(store):
    """A claim sent in the same pass as results of the same node runs before they are
    written: ``finished`` tells it which of the leased jobs have ended."""
    big_then_small(store)
    assert tenants_of(claim(store, 2)) == ["big", "small"]
    both = dict(pool="bulk", kinds={"render"}, n=1, node="node-a", lease=30.0, limits=FAIR)
    # small's job ended here: small runs none, its next job goes first
    assert tenants_of(store.claim(**both, finished={"small": 1})) == ["small"]
    # as leased, big and small run one each again (1 and 2): big's turn
    assert tenants_of(store.claim(**both)) == ["big"]
    # finished counts never go below none running, and caps still count the leases
    capped = ClaimLimits(tenant_max_inflight=2)
    assert store.claim(**{**both, "limits": capped}, finished={"big": 9, "small": 9}) == []


# ---- the weighted order against a reference, on random queues ----------------------------


def reference(queue, running, n, weights, cursor):
    """One job at a time: the tenant whose next slot comes in the earliest round (``weight``
    slots a round), then the earliest turn in it, the highest priority, the tenant after
    ``cursor`` in name order; jobs (id, tenant, priority) in priority-then-FIFO order within
    a tenant. Returns the ids taken and the tenant last served (the new cursor)."""
    tenants = sorted({t for _, t, _ in queue})
    if cursor is not None:
        tenants = [t for t in tenants if t > cursor] + [t for t in tenants if t <= cursor]
    left = sorted(queue, key=lambda j: (-j[2], j[0]))
    running = Counter(running)
    taken = []
    while left and len(taken) < n:
        keys = []
        for turn, tenant in enumerate(tenants):
            head = next((j for j in left if j[1] == tenant), None)
            if head is None:
                continue
            w, slot = Fraction(weights.get(tenant, 1)), running[tenant] + 1
            rounds = math.floor((slot - 1) / w)
            keys.append((rounds, slot - math.ceil(rounds * w), -head[2], turn, head))
        *_, head = min(keys)
        left.remove(head)
        taken.append(head)
        running[head[1]] += 1
    served = [t for t in tenants if t in {j[1] for j in taken}]
    return [j[0] for j in taken], served[-1] if served else None


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    jobs=st.lists(
        st.tuples(st.sampled_from(["", "a", "b", "c"]), st.integers(0, 2)), min_size=2, max_size=30
    ),
    claims=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    weights=st.sampled_from([{}, {"a": 3}, {"a": 2, "b": 0.5}, {"": 2, "c": 1.5}, {"b": 5}]),
)
def test_weighted_order_matches_the_reference(store, jobs, claims, weights):
    with store.engine.begin() as conn:
        conn.execute(delete(jobs_table))
    store._cursors.clear()
    store._one_tenant_at.clear()  # this example's queue is new: look at it (the clock stands)
    ids = store.enqueue_many([job(t or None, priority=p) for t, p in jobs])
    queue = [(i, t, p) for i, (t, p) in zip(ids, jobs, strict=True)]
    running: Counter[str] = Counter()
    cursor = None
    limits = ClaimLimits(weights=weights)
    for n in claims:
        if len({t for _, t, _ in queue}) > 1:
            expected, cursor = reference(queue, running, n, weights, cursor)
        else:  # one tenant: the plain claim, the cursor kept
            expected = [i for i, _, _ in sorted(queue, key=lambda j: (-j[2], j[0]))][:n]
        assert [c.job_id for c in claim(store, n, limits)] == expected
        for i, t, p in [j for j in queue if j[0] in expected]:
            queue.remove((i, t, p))
            running[t] += 1
