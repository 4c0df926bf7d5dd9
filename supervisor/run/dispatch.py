"""``Dispatcher``: moves jobs between the store and the workers, and keeps their leases.

    store ──claim──> buffer ──RunJob──> worker ──JobDone/JobFailed──> outbox ──ack/fail──> store
                       │                  │                             ^
                       └── release (drain)┴── exit: classify ──fail/release┘
    every heartbeat: one extend per pool for every lease held (buffer and workers); a lease
    that was not extended (taken over, reaped) kills its worker: never run a job whose lease
    you do not hold. So does a lease that ran out while the database was unreachable, or one
    that reached max_lease_extensions (a timeout).

Claims pass the pool's fleet-wide caps (``ClaimLimits``) and retry budget to the store, which
enforces both for every host at once; failures carry the budget too. Claims happen only for
idle workers (plus ``prefetch``), and only when a wake-up came, the
pool's adaptive poll is due, or a retry of a job this node failed becomes due (so retries keep
their backoff instead of waiting for an idle pool's slow poll). Results are written in batches
once per loop pass. When the store is unreachable every write stays in the outbox and is
retried with backoff; nothing is dropped. Owned by the supervisor's main thread.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from dataclasses import dataclass

from supervisor.clock import Clock
from supervisor.config import PoolConfig
from supervisor.errors import StoreUnavailable
from supervisor.model import Ack, Claimed, ClaimLimits, ErrorKind, Failure, Lease, RetryBudget
from supervisor.observe.logs import job_event
from supervisor.policy import KillReason, poll_delay, retry_delay
from supervisor.run.counters import Counters
from supervisor.run.exits import classify_exit
from supervisor.run.pool import Pool
from supervisor.run.workerproc import InFlight, WorkerHandle
from supervisor.store import Store
from supervisor.units import format_duration
from workers import exitcodes, protocol

log = logging.getLogger("fleetd.dispatch")
EXPIRED_READ = 100  # rows read per reaper pass to log (and count) expired leases one by one

PRUNE_EVERY = 60.0  # seconds between prunes of done jobs past the retention


@dataclass
class Buffered:
    """A job claimed ahead of a free worker (prefetch)."""

    claimed: Claimed
    lease_expires: float
    extensions: int = 0


class Dispatcher:
    def __init__(
        self,
        store: Store,
        pools: dict[str, Pool],
        node_id: str,
        clock: Clock,
        counters: Counters,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.pools = pools
        self.node_id = node_id
        self.clock = clock
        self.counters = counters
        self.rng = rng or random.Random()
        self.buffer: dict[str, deque[Buffered]] = {name: deque() for name in pools}
        self.acks: list[Ack] = []
        self.fails: list[tuple[str, Failure]] = []  # (pool, failure)
        self.releases: list[Lease] = []
        self.failed: dict[int, Claimed] = {}  # job id -> the claim, until its failure is written
        # pools whose jobs finished since the last flush: under a fleet-wide cap, writing the
        # result frees room, so a capped pool claims again at once instead of at its slow poll
        self.freed: set[str] = set()
        self.next_heartbeat = {name: 0.0 for name in pools}
        # when jobs this node failed become claimable again (monotonic, a heap per pool): an
        # idle pool polls then, not at its adaptive poll's next slow tick
        self.retries_due: dict[str, list[float]] = {name: [] for name in pools}
        self.next_reap = 0.0
        self.next_prune = 0.0
        self.store_retry_at = 0.0  # after a store error, no call before this
        self.store_failures = 0  # in a row

    # ---- claim and hand out ------------------------------------------------------------

    def wake(self, pool: Pool) -> None:
        """New jobs were announced for ``pool``: poll it on this pass."""
        pool.empty_claims = 0
        pool.next_poll_at = 0.0

    def claim(self, pool: Pool, now: float) -> None:
        """Claim for this pool's idle workers (plus prefetch) when its poll is due."""
        due = self.retries_due[pool.name]
        want = len(pool.idle()) + pool.config.prefetch - len(self.buffer[pool.name])
        if want <= 0 or now < pool.next_poll_at or now < self.store_retry_at:
            return
        while due and due[0] <= now:  # this claim sees those retries
            heapq.heappop(due)
        c = pool.config
        lease = c.lease
        limits = _limits(c)
        try:
            got = self.store.claim(
                pool=pool.name,
                kinds=pool.kinds,
                n=want,
                node=self.node_id,
                lease=lease,
                limits=limits if limits.capped else None,
                budget=_budget(c.retry_budget),
            )
        except StoreUnavailable as exc:
            self._store_failed(now, "claim", exc)
            return
        self._store_ok()
        for claimed in got:
            self.buffer[pool.name].append(Buffered(claimed, now + lease))
            self.counters.claimed[pool.name] += 1
            if claimed.attempt > 1:
                self.counters.redeliveries[pool.name] += 1
        pool.empty_claims = 0 if len(got) == want else pool.empty_claims + 1
        pool.next_poll_at = now + (0.0 if len(got) == want else poll_delay(pool.empty_claims))
        if due:
            pool.next_poll_at = min(pool.next_poll_at, due[0])

    def assign(self, pool: Pool, now: float) -> None:
        """Send buffered jobs to idle workers."""
        queue = self.buffer[pool.name]
        for worker in pool.idle():
            if not queue:
                return
            item = queue.popleft()
            c = item.claimed
            run = protocol.RunJob(
                c.job_id,
                c.kind,
                c.payload,
                c.attempt,
                self.clock.now() + pool.config.timeout,
                c.lease.token,
            )
            try:
                worker.send(run)
            except (OSError, TimeoutError):
                queue.appendleft(item)  # the worker is dying; its exit is handled on reap
                worker.kill(KillReason("retire", "worker stopped reading"), now)
                continue
            worker.state = "busy"
            worker.job = InFlight(
                c, now, now + pool.config.timeout, item.lease_expires, item.extensions
            )

    # ---- results and exits -------------------------------------------------------------

    def on_message(self, worker: WorkerHandle, msg: protocol.Message, now: float) -> None:
        pool = self.pools[worker.pool]
        job = worker.job
        if isinstance(msg, protocol.Ready) and worker.state == "starting":
            worker.state = "idle"
            pool.boot_failures = 0
        elif isinstance(msg, protocol.Started) and job is not None:
            job.started_ack = True
        elif isinstance(msg, protocol.JobDone) and job and job.claimed.job_id == msg.job_id:
            self.acks.append(Ack(job.claimed.lease, msg.result, msg.peak_rss, msg.duration))
            self.counters.job_finished(pool.name, "done", msg.duration, msg.peak_rss, now)
            if job.claimed.attempt > 1:  # a success, but not a plain one: say so once
                self._log_job(
                    logging.INFO,
                    "job_recovered",
                    job.claimed,
                    pool.name,
                    msg.duration,
                    msg.peak_rss,
                    None,
                    "done",
                )
            self._job_over(worker)
        elif isinstance(msg, protocol.JobFailed) and job and job.claimed.job_id == msg.job_id:
            kind = ErrorKind(msg.error_kind)
            message = msg.message
            if kind is ErrorKind.TIMEOUT:
                message = (
                    f"ran past its timeout of {format_duration(pool.config.timeout)}; "
                    "the handler stopped on SoftTimeout"
                )
            self._failure(pool, job, kind, message, msg.peak_rss, msg.duration)
            self._job_over(worker)
        elif isinstance(msg, protocol.Pong):
            worker.last_rss = msg.rss
        elif isinstance(msg, protocol.Recycling):
            worker.state = "stopping" if worker.job is None else worker.state

    def _job_over(self, worker: WorkerHandle) -> None:
        self.freed.add(worker.pool)
        worker.job = None
        worker.soft_signalled_at = None
        worker.jobs_done += 1
        if worker.state == "busy":
            worker.state = "idle"

    def on_exit(self, worker: WorkerHandle, status: int, now: float) -> None:
        """A worker was reaped: decide the fate of the job it held, if any."""
        job = worker.job
        if job is None:
            return
        pool = self.pools[worker.pool]
        code = status >> 8 if status & 0x7F == 0 else None
        if not job.started_ack and code == exitcodes.RECYCLE:
            self.releases.append(job.claimed.lease)  # never started: hand it back untouched
            return
        verdict = classify_exit(status, worker.kill_reason)
        if verdict.action == "fail":
            assert verdict.error_kind is not None
            peak = worker.last_rss
            self._failure(pool, job, verdict.error_kind, verdict.message, peak, now - job.started)
        elif verdict.action == "release":
            self.releases.append(job.claimed.lease)
        else:
            self.counters.lost_leases += 1
            log.warning("job %s: %s", job.claimed.job_id, verdict.message)

    def _failure(
        self,
        pool: Pool,
        job: InFlight,
        kind: ErrorKind,
        message: str,
        peak: int | None,
        duration: float | None,
    ) -> None:
        c = pool.config
        delay = (
            None
            if kind is ErrorKind.PERMANENT
            else retry_delay(job.claimed.attempt, c.retry_backoff, c.retry_backoff_max, self.rng)
        )
        budget = _budget(c.retry_budget)
        failure = Failure(job.claimed.lease, kind, message, delay, peak, duration, budget)
        self.fails.append((pool.name, failure))
        self.failed[job.claimed.job_id] = job.claimed  # for the dead-letter line, if it dies
        self.counters.job_finished(pool.name, str(kind), duration, peak, self.clock.monotonic())
        self._log_job(
            logging.INFO, "job_failed", job.claimed, pool.name, duration, peak, str(kind), message
        )

    def _log_job(
        self,
        level: int,
        event: str,
        c: Claimed,
        pool: str,
        duration: float | None,
        peak: int | None,
        error_kind: str | None,
        message: str,
    ) -> None:
        job_event(
            log,
            level,
            event,
            job_id=c.job_id,
            pool=pool,
            kind=c.kind,
            attempt=c.attempt,
            max_deliveries=c.max_deliveries,
            duration=duration,
            peak_rss=peak,
            error_kind=error_kind,
            message=message,
        )

    # ---- writing back ------------------------------------------------------------------

    def flush(self, now: float) -> None:
        """Write buffered acks, failures and releases (each list one call)."""
        if now < self.store_retry_at or not (self.acks or self.fails or self.releases):
            return
        try:
            if self.acks:
                self.counters.lost_leases += len(self.store.ack(self.acks))
                self.acks = []
            if self.fails:
                self._record_fails(self.store.fail([f for _, f in self.fails]))
                self.fails = []
            if self.releases:
                self.counters.releases += len(self.store.release(self.releases))
                self.releases = []
        except StoreUnavailable as exc:
            self._store_failed(now, "write results", exc)
            return
        self._store_ok()
        for name in self.freed:
            if _limits(self.pools[name].config).capped:
                self.wake(self.pools[name])
        self.freed.clear()

    def _record_fails(self, outcome) -> None:
        self.counters.lost_leases += len(outcome.lost)
        dead, retried = set(outcome.dead), set(outcome.retried)
        deferred = set(outcome.deferred)
        written = self.clock.monotonic()  # after the write: the store's "now + delay" is earlier
        for pool, f in self.fails:
            if f.lease.job_id in retried and f.retry_delay is not None:
                later = f.budget.window if f.budget and f.lease.job_id in deferred else 0.0
                heapq.heappush(self.retries_due[pool], written + f.retry_delay + later)
            claimed = self.failed.pop(f.lease.job_id, None)
            if f.lease.job_id in dead:
                self.counters.dead_letters[(pool, str(f.error_kind))] += 1
                if claimed is not None:
                    self._log_job(
                        logging.WARNING,
                        "job_dead",
                        claimed,
                        pool,
                        f.duration,
                        f.peak_rss,
                        str(f.error_kind),
                        f.message,
                    )
        if deferred:
            log.warning(
                "retry budget exhausted: %d failed job(s) deferred instead of retried at once",
                len(deferred),
            )

    def release_buffered(self) -> None:
        """Hand back every job claimed but not started (drain)."""
        for queue in self.buffer.values():
            self.releases.extend(item.claimed.lease for item in queue)
            queue.clear()

    @property
    def pending_writes(self) -> int:
        return len(self.acks) + len(self.fails) + len(self.releases)

    # ---- leases ------------------------------------------------------------------------

    def heartbeat(self, pool: Pool, now: float) -> None:
        """Extend every lease this pool holds, in one statement, when due."""
        if now < self.next_heartbeat[pool.name] or now < self.store_retry_at:
            return
        c = pool.config
        held = [w for w in pool.workers.values() if w.job is not None and w.kill_reason is None]
        for w in held:
            if w.job is not None and w.job.extensions >= c.max_lease_extensions:
                w.kill(
                    KillReason(
                        "timeout",
                        f"held its lease through max_lease_extensions "
                        f"({c.max_lease_extensions}) extensions",
                    ),
                    now,
                )
        held = [w for w in held if w.kill_reason is None]
        leases = [w.job.claimed.lease for w in held if w.job] + [
            b.claimed.lease for b in self.buffer[pool.name]
        ]
        if not leases:
            self.next_heartbeat[pool.name] = now + c.heartbeat
            return
        try:
            lost = set(self.store.extend(leases, lease=c.lease))
        except StoreUnavailable as exc:
            self._store_failed(now, "extend leases", exc)
            return
        self._store_ok()
        self.next_heartbeat[pool.name] = now + c.heartbeat
        self._apply_extension(pool, held, lost, now)

    def _apply_extension(
        self, pool: Pool, held: list[WorkerHandle], lost: set[Lease], now: float
    ) -> None:
        lease = pool.config.lease
        for w in held:
            job = w.job
            if job is None:
                continue
            if job.claimed.lease in lost:
                self.counters.lost_leases += 1
                w.kill(KillReason("lease_lost", "its lease was taken over or expired"), now)
            else:
                job.lease_expires, job.extensions = now + lease, job.extensions + 1
        kept = deque(b for b in self.buffer[pool.name] if b.claimed.lease not in lost)
        for b in kept:
            b.lease_expires, b.extensions = now + lease, b.extensions + 1
        self.buffer[pool.name] = kept

    def expire_unheld(self, now: float) -> None:
        """Kill workers whose lease ran out without an extension (database unreachable)."""
        for pool in self.pools.values():
            for w in pool.busy():
                if w.job is not None and w.kill_reason is None and now >= w.job.lease_expires:
                    self.counters.lost_leases += 1
                    w.kill(
                        KillReason(
                            "lease_lost", "its lease ran out while the database was unreachable"
                        ),
                        now,
                    )
            live = deque(b for b in self.buffer[pool.name] if b.lease_expires > now)
            self.buffer[pool.name] = live

    def reap(self, now: float, interval: float) -> None:
        """Return expired leases of any node to the queue (every node runs this)."""
        if now < self.next_reap or now < self.store_retry_at:
            return
        try:
            out = self.store.reap()
        except StoreUnavailable as exc:
            self._store_failed(now, "reap", exc)
            return
        self._store_ok()
        self.next_reap = now + interval
        if out.count:
            self.counters.lease_expiries += out.count
            log.warning(
                "reaper: %d expired lease(s): %d requeued, %d dead",
                out.count,
                len(out.requeued),
                len(out.dead),
            )
            self._expired_jobs(out.dead, out.requeued)

    def _expired_jobs(self, dead_ids: tuple[int, ...], requeued: tuple[int, ...]) -> None:
        """One log line per job whose lease expired, and the dead ones counted as dead
        letters (the reaper returns only ids, so the rows are read: at most
        ``EXPIRED_READ`` per pass; more are only in the summary line)."""
        dead = set(dead_ids)
        for job_id in [*dead_ids, *requeued][:EXPIRED_READ]:
            try:
                job = self.store.get(job_id)
            except StoreUnavailable:
                return
            if job is None:
                continue
            if job_id in dead:
                self.counters.dead_letters[(job.pool, str(ErrorKind.LEASE_EXPIRED))] += 1
            job_event(
                log,
                logging.WARNING,
                "job_dead" if job_id in dead else "job_lease_expired",
                job_id=job.id,
                pool=job.pool,
                kind=job.kind,
                attempt=job.attempts,
                max_deliveries=job.max_deliveries,
                duration=job.duration,
                peak_rss=job.peak_rss,
                error_kind=str(ErrorKind.LEASE_EXPIRED),
                message=job.last_error or "its lease expired",
            )

    def prune(self, now: float, retention: float) -> None:
        """Delete done jobs older than the retention, once a minute (every node; batched)."""
        if now < self.next_prune or now < self.store_retry_at:
            return
        self.next_prune = now + PRUNE_EVERY
        try:
            removed = self.store.prune(older_than=retention)
        except StoreUnavailable as exc:
            self._store_failed(now, "prune", exc)
            return
        if removed:
            log.info("pruned %d done job(s) older than the retention", removed)

    # ---- store health ------------------------------------------------------------------

    def _store_failed(self, now: float, what: str, exc: Exception) -> None:
        self.counters.store_errors += 1
        self.store_failures += 1
        backoff = min(5.0, 0.1 * 2 ** min(self.store_failures - 1, 10))
        self.store_retry_at = now + backoff
        if self.store_failures == 1 or self.store_failures % 20 == 0:
            log.error(
                "store unavailable (%s): %s; retrying in %.1fs (%d failures in a row)",
                what,
                exc,
                backoff,
                self.store_failures,
            )

    def _store_ok(self) -> None:
        if self.store_failures:
            log.warning("store reachable again after %d failed calls", self.store_failures)
        self.store_failures = 0
        self.store_retry_at = 0.0


def _limits(c: PoolConfig) -> ClaimLimits:
    """The pool's fleet-wide caps, as the store's claim takes them."""
    return ClaimLimits(c.max_inflight, c.tenant_max_inflight, c.kind_max_inflight)


def _budget(ratio: float | None) -> RetryBudget | None:
    """The pool's retry budget (``retry_budget``; floor and window at their defaults)."""
    return None if ratio is None else RetryBudget(ratio)
