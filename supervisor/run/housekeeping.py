"""``Housekeeping``: what every node does for the whole queue, on the chores link (its own
store process, so an extend never waits behind it).

- the reaper: expired leases of any node back to the queue (or dead at the delivery limit),
  one log line per job (at most ``EXPIRED_READ`` a pass); a host killed with SIGKILL loses
  nothing. On PostgreSQL it also vacuums the job table when dead rows pile up.
- prune: done jobs past the retention deleted, once a minute, in batches.

One call of each in flight at a time. Owned by the main thread.
"""

from __future__ import annotations

import logging

from supervisor.clock import Clock
from supervisor.model import ErrorKind
from supervisor.observe.logs import job_event
from supervisor.run.counters import Counters
from supervisor.run.link import Link, Reply
from supervisor.run.outbox import StoreHealth
from supervisor.run.requests import Prune, Reap

log = logging.getLogger("fleetd.dispatch")
EXPIRED_READ = 100  # rows read per reaper pass to log (and count) expired leases one by one
PRUNE_EVERY = 60.0  # seconds between prunes of done jobs past the retention


class Housekeeping:
    def __init__(self, chores: Link, clock: Clock, counters: Counters, health: StoreHealth):
        self.chores = chores
        self.clock = clock
        self.counters = counters
        self.health = health
        self.reaping = self.pruning = False
        self.next_reap = 0.0
        self.next_prune = 0.0

    def reap(self, now: float, interval: float) -> None:
        """Return expired leases of any node to the queue (every node runs this)."""
        if self.reaping or now < self.next_reap or now < self.health.retry_at:
            return
        self.reaping = True
        self.next_reap = now + interval
        self.chores.submit(Reap(EXPIRED_READ), on_reply=self._reaped)

    def _reaped(self, reply: Reply) -> None:
        self.reaping = False
        if reply.error is not None:
            self.health.failed(self.clock.monotonic(), "reap", reply.error)
            return
        self.health.ok()
        out, rows = reply.value
        if not out.count:
            return
        self.counters.lease_expiries += out.count
        log.warning(
            "reaper: %d expired lease(s): %d requeued, %d dead, %d cancelled",
            out.count,
            len(out.requeued),
            len(out.dead),
            len(out.cancelled),
        )
        dead, cancelled = set(out.dead), set(out.cancelled)
        for job in rows:  # one line per job (at most EXPIRED_READ a pass)
            if job.id in dead:
                self.counters.dead_letters[(job.pool, str(ErrorKind.LEASE_EXPIRED))] += 1
            # a job whose cancel was asked ends cancelled, not requeued; its error_kind says
            # what ended that delivery (lease_expired), as a failure that crossed a cancel
            # keeps its own
            event = (
                "job_dead"
                if job.id in dead
                else "job_cancelled"
                if job.id in cancelled
                else "job_lease_expired"
            )
            job_event(
                log,
                logging.WARNING,
                event,
                job_id=job.id,
                pool=job.pool,
                kind=job.kind,
                attempt=out.attempts.get(job.id, job.attempts),  # not a later claim's
                max_deliveries=job.max_deliveries,
                duration=job.duration,
                peak_rss=job.peak_rss,
                error_kind=str(ErrorKind.LEASE_EXPIRED),
                message=job.last_error or "its lease expired",
            )

    def prune(self, now: float, retention: float) -> None:
        """Delete done jobs older than the retention, once a minute (every node; batched)."""
        if self.pruning or now < self.next_prune or now < self.health.retry_at:
            return
        self.pruning = True
        self.next_prune = now + PRUNE_EVERY
        self.chores.submit(Prune(retention), on_reply=self._pruned)

    def _pruned(self, reply: Reply) -> None:
        self.pruning = False
        if reply.error is not None:
            self.health.failed(self.clock.monotonic(), "prune", reply.error)
        elif reply.value:
            log.info("pruned %d done job(s) older than the retention", reply.value)

    def due_at(self) -> float | None:
        """The next reap, unless one is in flight (its reply wakes the loop). The prune is
        no timer: it runs at the passes the others make."""
        return None if self.reaping else max(self.next_reap, self.health.retry_at)
