"""A property test of the lease state machine: random sequences of enqueue, claim, extend,
ack, fail, release, reap and clock moves, on each engine, checked against a small model after
every step.

Invariants: no job is lost; a job never has two valid leases (a lease is valid only while it is
the latest one issued for a leased job); attempts never decrease except by exactly one on a
release; a job is dead only when attempts reached max_deliveries or it failed permanently;
release never counts a delivery; every verb reports exactly the leases it could not use.

Capped claims (``ClaimLimits``) and fair claims without caps (with or without weights) are
checked against a reference of the weighted fair order written independently of
supervisor/store/fair.py: repeatedly take the job whose tenant's next slot (leased-or-just-taken
+ 1) falls in the earliest round of its weight, then the earliest turn in that round, then the
highest priority, then the tenant next in round-robin turn; never past the pool's or a tenant's
cap. A fair claim without caps while at most one tenant is queued is the plain claim (and
leaves the round-robin cursor where it was).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete

from supervisor.clock import FakeClock
from supervisor.model import Ack, ClaimLimits, ErrorKind, Failure, JobState, Lease, NewJob
from supervisor.store.fair import GUARD_EVERY
from supervisor.store.schema import jobs

POOL, KINDS, LEASE = "p", {"k"}, 10.0
WEIGHTS = [{}, {"a": 3}, {"a": 2, "b": 0.5}, {"": 2, "c": 1.5}]


@dataclass
class Expected:
    state: JobState
    attempts: int
    max_deliveries: int
    priority: int
    available_at: float
    token: str | None = None  # the valid lease, when leased
    locked_until: float = 0.0
    permanent: bool = False
    tenant: str = ""  # no tenant is the tenant ""


class LeaseMachine(RuleBasedStateMachine):
    store = None  # set by the test
    clock: FakeClock

    @initialize()
    def reset(self) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(delete(jobs))
        self.clock = self.store._clock
        self.model: dict[int, Expected] = {}
        self.issued: list[Lease] = []  # every lease ever handed out, stale ones included
        self.tokens: set[str] = set()
        self.store._cursors.clear()  # the round-robin cursor: where the last capped claim ended
        self.cursor: str | None = None
        # when (monotonic) a fair claim last found one tenant queued: for GUARD_EVERY after
        # it, the pool's fair claims are plain claims (a tenant arriving is seen that late)
        self.store._one_tenant_at.clear()
        self.one_tenant_at: float | None = None
        # whether the store goes straight to the fair claim (it found tenants mixed, and its
        # last fair claim still saw more than one): such a claim never starts the interval
        self.store._mixed_pools.clear()
        self.mixed = False

    def now(self) -> float:
        return self.clock.now()

    def valid(self, lease: Lease) -> bool:
        e = self.model[lease.job_id]
        return e.state is JobState.LEASED and e.token == lease.token

    @rule(
        n=st.integers(1, 4),
        priority=st.integers(0, 2),
        delay=st.sampled_from([0, 0, 5]),
        max_deliveries=st.integers(1, 3),
        tenant=st.sampled_from([None, "a", "b", "c"]),
    )
    def enqueue(
        self, n: int, priority: int, delay: float, max_deliveries: int, tenant: str | None
    ) -> None:
        new = [
            NewJob(
                "k",
                POOL,
                json.dumps({"i": i}),
                max_deliveries,
                priority=priority,
                delay=delay,
                tenant=tenant,
            )
            for i in range(n)
        ]
        for jid in self.store.enqueue_many(new):
            assert jid not in self.model
            self.model[jid] = Expected(
                JobState.QUEUED,
                0,
                max_deliveries,
                priority,
                self.now() + delay,
                tenant=tenant or "",
            )

    @rule(n=st.integers(1, 5))
    def claim(self, n: int) -> None:
        ready = sorted(
            (e.priority * -1, e.available_at, jid)
            for jid, e in self.model.items()
            if e.state is JobState.QUEUED and e.available_at <= self.now()
        )
        expected = [jid for _, _, jid in ready[:n]]
        got = self.store.claim(pool=POOL, kinds=KINDS, n=n, node="n", lease=LEASE)
        assert [c.job_id for c in got] == expected
        for c in got:
            e = self.model[c.job_id]
            assert c.lease.token not in self.tokens, "a lease token was handed out twice"
            self.tokens.add(c.lease.token)
            e.state, e.attempts, e.token = JobState.LEASED, e.attempts + 1, c.lease.token
            e.locked_until = self.now() + LEASE
            assert c.attempt == e.attempts
            self.issued.append(c.lease)

    @rule(
        n=st.integers(1, 5),
        max_inflight=st.sampled_from([None, 1, 2, 4]),
        tenant_max=st.sampled_from([None, 1, 2]),
        weights=st.sampled_from(WEIGHTS),
    )
    def claim_capped(
        self, n: int, max_inflight: int | None, tenant_max: int | None, weights: dict[str, float]
    ) -> None:
        limits = ClaimLimits(max_inflight, tenant_max, weights=weights)
        if not limits.capped:
            limits = ClaimLimits(max_inflight=100, weights=weights)
        expected = self.fair_choice(n, limits)
        got = self.store.claim(pool=POOL, kinds=KINDS, n=n, node="n", lease=LEASE, limits=limits)
        assert [c.job_id for c in got] == expected
        for c in got:
            e = self.model[c.job_id]
            assert c.lease.token not in self.tokens
            self.tokens.add(c.lease.token)
            e.state, e.attempts, e.token = JobState.LEASED, e.attempts + 1, c.lease.token
            e.locked_until = self.now() + LEASE
            assert c.attempt == e.attempts and (c.tenant or "") == e.tenant
            self.issued.append(c.lease)

    @rule(n=st.integers(1, 5), weights=st.sampled_from(WEIGHTS))
    def claim_fair(self, n: int, weights: dict[str, float]) -> None:
        """A pool without caps, fair by default: fair order while more than one tenant has
        queued jobs, else the plain claim."""
        limits = ClaimLimits(weights=weights)
        queued = {e.tenant for e in self.model.values() if e.state is JobState.QUEUED}
        at = self.clock.monotonic()
        recent = self.one_tenant_at is not None and at - self.one_tenant_at < GUARD_EVERY
        known = recent and not self.mixed
        if len(queued) > 1 and not known:
            expected = self.fair_choice(n, limits)
        else:
            ready = sorted(
                (-e.priority, e.available_at, jid)
                for jid, e in self.model.items()
                if e.state is JobState.QUEUED and e.available_at <= self.now()
            )
            expected = [jid for _, _, jid in ready[:n]]
        got = self.store.claim(pool=POOL, kinds=KINDS, n=n, node="n", lease=LEASE, limits=limits)
        assert [c.job_id for c in got] == expected
        if self.mixed or (len(queued) > 1 and not known):  # the fair claim ran
            self.mixed = len(queued) > 1
        elif got and not known:  # the guarded plain claim took jobs: one tenant queued
            self.one_tenant_at = at
        for c in got:
            e = self.model[c.job_id]
            assert c.lease.token not in self.tokens
            self.tokens.add(c.lease.token)
            e.state, e.attempts, e.token = JobState.LEASED, e.attempts + 1, c.lease.token
            e.locked_until = self.now() + LEASE
            self.issued.append(c.lease)

    def fair_choice(self, n: int, limits: ClaimLimits) -> list[int]:
        """The reference: one job at a time, from the tenant whose next slot comes in the
        earliest round (a round holds ``weight`` slots of a tenant), then the earliest turn
        in it, highest priority, then round-robin turn after the cursor; within the caps."""
        leased = [e for e in self.model.values() if e.state is JobState.LEASED]
        running = {t: sum(e.tenant == t for e in leased) for t in ("", "a", "b", "c")}
        queued = {e.tenant for e in self.model.values() if e.state is JobState.QUEUED}
        order = sorted(queued)
        if self.cursor is not None:
            order = [t for t in order if t > self.cursor] + [t for t in order if t <= self.cursor]
        ready = sorted(
            (-e.priority, e.available_at, jid)
            for jid, e in self.model.items()
            if e.state is JobState.QUEUED and e.available_at <= self.now()
        )
        room = n if limits.max_inflight is None else min(n, limits.max_inflight - len(leased))
        if room <= 0:
            return []  # the pool is full: the claim stops before its window (cursor kept)
        taken: list[int] = []
        while len(taken) < room:
            heads = []
            for turn, tenant in enumerate(order):
                if limits.tenant_max_inflight is not None and running[tenant] >= (
                    limits.tenant_max_inflight
                ):
                    continue
                head = next((r for r in ready if self.model[r[2]].tenant == tenant), None)
                if head is not None:
                    w = Fraction(limits.weights.get(tenant, 1))
                    slot = running[tenant] + 1  # the slot this job would be, 1-based
                    rounds = math.floor((slot - 1) / w)  # whole rounds before its own
                    in_round = slot - math.ceil(rounds * w)
                    heads.append((rounds, in_round, head[0], turn, head))
            if not heads:
                break
            *_, head = min(heads)
            ready.remove(head)
            taken.append(head[2])
            running[self.model[head[2]].tenant] += 1
        served = [t for t in order if t in {self.model[j].tenant for j in taken}]
        # the last tenant served; none served (and fewer tenants than a window): the first next
        self.cursor = served[-1] if served else None
        return taken

    def pick(self, data: st.DataObject) -> list[Lease]:
        return data.draw(st.lists(st.sampled_from(self.issued), max_size=4, unique=True))

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        leases = self.pick(data)
        lost = self.store.extend(leases, lease=LEASE)
        assert lost == [x for x in leases if not self.valid(x)]
        for x in leases:
            if self.valid(x):
                self.model[x.job_id].locked_until = self.now() + LEASE

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        leases = self.pick(data)
        lost = self.store.ack([Ack(x, json.dumps(x.token)) for x in leases])
        assert lost == [x for x in leases if not self.valid(x)]
        for x in leases:
            if x not in lost:
                self.model[x.job_id].state = JobState.DONE

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), permanent=st.booleans(), delay=st.sampled_from([0.0, 3.0]))
    def fail(self, data: st.DataObject, permanent: bool, delay: float) -> None:
        leases = self.pick(data)
        failures = [
            Failure(x, ErrorKind.EXCEPTION, "boom", None if permanent else delay) for x in leases
        ]
        out = self.store.fail(failures)
        assert list(out.lost) == [x for x in leases if not self.valid(x)]
        for x in leases:
            if x in out.lost:
                continue
            e = self.model[x.job_id]
            if permanent or e.attempts >= e.max_deliveries:
                e.state, e.permanent = JobState.DEAD, permanent
                assert x.job_id in out.dead
            else:
                e.state, e.available_at = JobState.QUEUED, self.now() + delay
                assert x.job_id in out.retried

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        leases = self.pick(data)
        released = self.store.release(leases)
        assert released == sorted(x.job_id for x in leases if self.valid(x))
        for jid in released:
            e = self.model[jid]
            e.state, e.attempts, e.available_at = JobState.QUEUED, e.attempts - 1, self.now()

    @rule()
    def reap(self) -> None:
        out = self.store.reap()
        for jid, e in self.model.items():
            if e.state is JobState.LEASED and e.locked_until < self.now():
                if e.attempts >= e.max_deliveries:
                    e.state = JobState.DEAD
                    assert jid in out.dead
                else:
                    e.state, e.available_at = JobState.QUEUED, self.now()
                    assert jid in out.requeued
        assert out.count == len(set(out.dead) | set(out.requeued))

    @rule(seconds=st.sampled_from([1.0, 4.0, 11.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def store_matches_model(self) -> None:
        if not hasattr(self, "model"):
            return
        rows = {j.id: j for j in self.store.list_jobs(limit=10_000)}
        assert set(rows) == set(self.model), "a job was lost or invented"
        for jid, e in self.model.items():
            row = rows[jid]
            assert (row.state, row.attempts) == (e.state, e.attempts), jid
            assert row.attempts >= 0
            if row.state is JobState.DEAD:
                assert e.permanent or row.attempts >= row.max_deliveries
            if row.state is JobState.QUEUED:
                assert row.available_at == e.available_at


@pytest.mark.parametrize("examples", [40])
def test_lease_state_machine(store, examples: int) -> None:
    LeaseMachine.store = store
    run_state_machine_as_test(
        LeaseMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
