"""``LeaseKeeper``: the leases of the jobs this node holds, kept or given up on time.

    every heartbeat, per pool: one extend for every lease it holds (its workers' jobs and its
    buffer); one extend in flight at a time ──reply──> a lease not extended (taken over,
    reaped) kills its worker; the others run out no earlier than the call's start + lease
    every pass: a lease that ran out before the store confirmed an extension (the store away
    or stalled) kills its worker; so does one at max_lease_extensions (a timeout)

Rule: never run a job whose lease you do not hold. The deadline is kept on the monotonic
clock from the start of the last call that extended it, so however long the store takes to
answer, a job never runs past what the database granted. Owned by the main thread.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from supervisor.clock import Clock
from supervisor.model import Claimed, Lease
from supervisor.policy import KillKind, KillReason
from supervisor.run.counters import Counters
from supervisor.run.link import Link, Reply
from supervisor.run.outbox import StoreHealth
from supervisor.run.pool import Pool
from supervisor.run.requests import Extend


@dataclass(slots=True)
class Buffered:
    """A job claimed ahead of a free worker (prefetch)."""

    claimed: Claimed
    lease_expires: float
    extensions: int = 0


class LeaseKeeper:
    def __init__(
        self,
        link: Link,
        pools: dict[str, Pool],
        buffer: dict[str, deque[Buffered]],
        clock: Clock,
        counters: Counters,
        health: StoreHealth,
    ) -> None:
        self.link = link
        self.pools = pools
        self.buffer = buffer  # the dispatcher's: claimed jobs not sent to a worker yet
        self.clock = clock
        self.counters = counters
        self.health = health
        self.next_heartbeat = {name: 0.0 for name in pools}
        self.extending: set[str] = set()  # pools with an extend in flight

    def heartbeat(self, pool: Pool, now: float) -> None:
        """Extend every lease this pool holds, in one statement, when due (one in flight)."""
        if now < self.next_heartbeat[pool.name] or now < self.health.retry_at:
            return
        if pool.name in self.extending:
            return
        c = pool.config
        for w in pool.workers.values():
            if w.job is None or w.kill_reason is not None:
                continue
            spent = [j for j in w.running.values() if j.extensions >= c.max_lease_extensions]
            if spent:
                w.kill(
                    KillReason(
                        KillKind.TIMEOUT,
                        f"held its lease through max_lease_extensions "
                        f"({c.max_lease_extensions}) extensions",
                        spent[0].claimed.job_id,
                    ),
                    now,
                )
        held = [w for w in pool.workers.values() if w.job is not None and w.kill_reason is None]
        leases = [j.claimed.lease for w in held for j in w.jobs()] + [
            b.claimed.lease for b in self.buffer[pool.name]
        ]
        if not leases:
            self.next_heartbeat[pool.name] = now + c.heartbeat
            return
        self.extending.add(pool.name)
        sent = set(leases)
        self.link.submit(
            Extend(leases, c.lease),
            on_reply=lambda reply: self._extended(pool, sent, now + c.heartbeat, reply),
        )

    def _extended(self, pool: Pool, sent: set[Lease], next_due: float, reply: Reply) -> None:
        """Apply an extend's reply to the jobs still held: a lease that was not extended
        (taken over, reaped) kills its worker; the others run out no earlier than the call's
        start plus the lease."""
        self.extending.discard(pool.name)
        now = self.clock.monotonic()
        if reply.error is not None:
            self.health.failed(now, "extend leases", reply.error)
            return
        self.health.ok()
        self.next_heartbeat[pool.name] = next_due
        lost = set(reply.value)
        expires = reply.started + pool.config.lease
        for w in pool.workers.values():
            if w.job is None or w.kill_reason is not None:
                continue
            gone = [j for j in w.running.values() if j.claimed.lease in lost]
            if gone:  # in a worker with slots: that job is forgotten, its siblings released
                self.counters.lost_leases += 1
                why = "its lease was taken over or expired"
                w.kill(KillReason(KillKind.LEASE_LOST, why, gone[0].claimed.job_id), now)
                continue
            if any(q.claimed.lease in lost for q in w.queued):
                # never start a job whose lease is gone: stop the worker before it does (its
                # running job, still ours, is released; the others too)
                self.counters.lost_leases += 1
                w.kill(KillReason(KillKind.RETIRE, "a job queued on it lost its lease"), now)
                continue
            for j in w.jobs():
                if j.claimed.lease in sent:
                    j.lease_expires, j.extensions = max(j.lease_expires, expires), j.extensions + 1
        kept = deque(b for b in self.buffer[pool.name] if b.claimed.lease not in lost)
        for b in kept:
            if b.claimed.lease in sent:
                b.lease_expires, b.extensions = max(b.lease_expires, expires), b.extensions + 1
        self.buffer[pool.name] = kept

    def expire_unheld(self, now: float) -> None:
        """Kill workers whose lease ran out without an extension (the store unreachable or
        stalled): never run a job whose lease you do not hold."""
        for pool in self.pools.values():
            for w in pool.watched():
                if w.job is None or w.kill_reason is not None:
                    continue
                first = min(w.jobs(), key=lambda j: j.lease_expires)
                if now >= first.lease_expires:
                    self.counters.lost_leases += 1
                    # in a worker with slots: about the job whose lease ran out (forgotten;
                    # its siblings are released), not the oldest
                    lost = first.claimed.job_id if first.claimed.job_id in w.running else None
                    w.kill(
                        KillReason(
                            KillKind.LEASE_LOST,
                            "its lease ran out before the store confirmed an extension",
                            lost,
                        ),
                        now,
                    )
            live = deque(b for b in self.buffer[pool.name] if b.lease_expires > now)
            self.buffer[pool.name] = live
