"""``Dispatcher``: moves jobs between the store and the workers, and keeps their leases.

    store ──claim──> buffer ──RunJob──> worker ──JobDone/JobFailed──> outbox ──ack/fail──> store
                       │                  │                             ^
                       └── release (drain)┴── exit: classify ──fail/release┘
    every heartbeat: one extend per pool for every lease held (buffer and workers); a lease
    that was not extended (taken over, reaped) kills its worker: never run a job whose lease
    you do not hold. So does a lease that ran out while the database was unreachable, or one
    that reached max_lease_extensions (a timeout).

Claims pass the pool's fleet-wide caps (``ClaimLimits``) and retry budget to the store, which
enforces both for every host at once; failures carry the budget too. Claims are sized by the
workers' room (an idle worker; for a pool of short jobs, what its pipeline may still hold, see
``claim``) plus ``prefetch``, and happen only when a wake-up came, the pool's adaptive poll is
due, or a retry of a job this node failed becomes due (so retries keep their backoff instead of
waiting for an idle pool's slow poll). Results are written in batches: failures and releases on
the pass that saw them, acks up to ``ACK_WAIT`` later. When the store is unreachable every
write stays in the outbox and is retried with backoff; nothing is dropped. Owned by the
supervisor's main thread.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from supervisor.clock import Clock
from supervisor.errors import StoreRejected, StoreUnavailable
from supervisor.model import Ack, Claimed, ErrorKind, Failure, Lease, RetryBudget
from supervisor.observe.logs import job_event
from supervisor.policy import KillKind, KillReason, poll_delay, retry_delay
from supervisor.run.counters import Counters
from supervisor.run.exits import classify_exit
from supervisor.run.pool import Pool
from supervisor.run.workerproc import InFlight, WorkerHandle, WorkerState
from supervisor.storable import UnstorableResult, storable_message, storable_result
from supervisor.store import Store
from supervisor.units import format_duration
from workers import exitcodes, protocol

log = logging.getLogger("fleetd.dispatch")
EXPIRED_READ = 100  # rows read per reaper pass to log (and count) expired leases one by one

PRUNE_EVERY = 60.0  # seconds between prunes of done jobs past the retention
PIPELINE_BYTES = 64 * 1024  # frame bytes queued behind a worker's running job, at most
# seconds a result may wait for others to share its write, while other jobs run: a commit costs
# SQLite ~150 µs whatever it holds, a few µs a job at a busy pool's pace
ACK_WAIT = 0.005
# nothing more is queued behind a job running longer than this: it is not a short one. Well
# above the pipeline's budget: on two cores a busy worker can go unscheduled for milliseconds
QUEUE_BEHIND_AT_MOST = 0.05
ACK_BATCH = 100  # results that are written at once, without waiting
_REFUSED = "fleetd: "  # starts a failure message fleetd wrote in place of a refused one


@dataclass(slots=True)
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
        self.acks: list[tuple[str, Ack]] = []  # (pool, ack)
        self.acks_due = 0.0  # when the oldest unwritten ack must be written (monotonic)
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
        """Claim for this pool's free room plus ``prefetch`` when its poll is due. Room is a
        worker that holds nothing, or, for a pool that pipelines (short jobs), what its
        workers may still be sent (none behind a job running long); such a pool also claims
        a second pipeline's worth ahead, and only once half of what it wants is missing, so
        one claim serves many jobs."""
        depth, max_jobs = pool.depth(), pool.config.max_jobs_per_worker
        capacity = room = 0
        empty = False
        for worker in pool.workers.values():
            if _behind_long_job(worker, now):
                continue  # nothing goes behind it: claim nothing for this worker
            free = worker.room(depth, max_jobs)
            held = worker.held()
            if free > 0 or held:
                capacity += free + held
                room += free
                empty = empty or (free > 0 and not held)
        ahead = pool.config.prefetch + (capacity if depth > 1 else 0)
        want = room + ahead - len(self.buffer[pool.name])
        if want <= 0 or not (depth == 1 or empty or 2 * want >= capacity):
            return
        if now < pool.next_poll_at or now < self.store_retry_at:
            return
        due = self.retries_due[pool.name]
        while due and due[0] <= now:  # this claim sees those retries
            heapq.heappop(due)
        c = pool.config
        lease = c.lease
        limits = pool.limits
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
        """Send buffered jobs to workers with room, the least loaded first, in claim order.
        A job goes behind a running one only while the worker's queued frames stay under
        ``PIPELINE_BYTES`` (so the socket always takes them without waiting)."""
        queue = self.buffer[pool.name]
        if not queue:
            return
        c = pool.config
        depth = pool.depth()
        workers = pool.workers
        # a worker that still has work is topped up only once half its room is free (one
        # write, one wake-up, many jobs), and not at all behind a job that has run longer
        # than QUEUE_BEHIND_AT_MOST: that job is not short, whatever the last ones were
        room = {pid: self._room(w, depth, c.max_jobs_per_worker, now) for pid, w in workers.items()}
        ahead = {pid: w.held() for pid, w in workers.items()}
        queued_bytes = {pid: w.queued_bytes for pid, w in workers.items()}
        sends: dict[int, list[tuple[Buffered, bytes]]] = {}
        wall = self.clock.now()
        while queue:
            open_ = [pid for pid, r in room.items() if r > 0]
            if not open_:
                break
            pid = min(open_, key=ahead.__getitem__)
            item = queue[0]
            cl = item.claimed
            try:
                frame = protocol.encode(
                    protocol.RunJob(
                        cl.job_id, cl.kind, cl.payload, cl.attempt, wall + c.timeout, cl.lease.token
                    )
                )
            except protocol.FrameTooLarge as exc:  # no worker could ever take it
                queue.popleft()
                never = InFlight(cl, now, now, item.lease_expires, item.extensions)
                self._failure(pool, never, ErrorKind.PERMANENT, f"cannot be sent: {exc}", None, 0.0)
                continue
            if ahead[pid] and queued_bytes[pid] + len(frame) > PIPELINE_BYTES:
                room[pid] = 0  # full for now (a worker with nothing ahead takes any size)
                continue
            queue.popleft()
            if ahead[pid]:
                queued_bytes[pid] += len(frame)
            room[pid] -= 1
            ahead[pid] += 1
            sends.setdefault(pid, []).append((item, frame))
        for pid, items in sends.items():
            worker = workers[pid]
            try:
                worker.send_bytes(b"".join(frame for _, frame in items))
            except TimeoutError:
                queue.extendleft(item for item, _ in reversed(items))
                worker.kill(KillReason(KillKind.RETIRE, "worker stopped reading"), now)
                continue
            except OSError:
                # its end is closed: it is exiting (its current job may have crashed it), and
                # the exit decides that job's fate; nothing more is sent to it
                queue.extendleft(item for item, _ in reversed(items))
                worker.state = WorkerState.STOPPING
                continue
            for item, frame in items:
                job = InFlight(item.claimed, now, math.inf, item.lease_expires, item.extensions)
                worker.take(job, len(frame), now, c.timeout)

    @staticmethod
    def _room(worker: WorkerHandle, depth: int, max_jobs: int | None, now: float) -> int:
        room = worker.room(depth, max_jobs)
        if worker.job is not None and (room * 2 < depth or _behind_long_job(worker, now)):
            return 0
        return room

    # ---- results and exits -------------------------------------------------------------

    def on_message(self, worker: WorkerHandle, msg: protocol.Message, now: float) -> None:
        pool = self.pools[worker.pool]
        job = worker.job
        if isinstance(msg, protocol.Ready) and worker.state == WorkerState.STARTING:
            worker.state = WorkerState.IDLE
            pool.boot_failures = 0
        elif isinstance(msg, protocol.JobDone) and job and job.claimed.job_id == msg.job_id:
            try:
                result = storable_result(msg.result)
            except UnstorableResult as exc:
                self._failure(pool, job, ErrorKind.PERMANENT, str(exc), msg.peak_rss, msg.duration)
                self._job_over(pool, worker, msg.duration, now)
                return
            if not self.acks:
                self.acks_due = now + ACK_WAIT
            self.acks.append(
                (pool.name, Ack(job.claimed.lease, result, msg.peak_rss, msg.duration))
            )
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
            self._job_over(pool, worker, msg.duration, now)
        elif isinstance(msg, protocol.JobFailed) and job and job.claimed.job_id == msg.job_id:
            kind = ErrorKind(msg.error_kind)
            soft = worker.soft_target
            if kind is ErrorKind.TIMEOUT and soft is not None and soft != msg.job_id:
                # the SoftTimeout meant for the job before it, whose result was already on
                # its way, landed in this one: not its failure
                self.releases.append(job.claimed.lease)
                self._job_over(pool, worker, msg.duration, now)
                return
            message = storable_message(msg.message)  # a handler's text: NUL, surrogates, size
            if kind is ErrorKind.TIMEOUT:
                message = (
                    f"ran past its timeout of {format_duration(pool.config.timeout)}; "
                    "the handler stopped on SoftTimeout"
                )
            self._failure(pool, job, kind, message, msg.peak_rss, msg.duration)
            self._job_over(pool, worker, msg.duration, now)
        elif isinstance(msg, protocol.Returned):
            returned = worker.returned(msg.job_id, now, pool.config.timeout)
            if returned is not None:
                self.releases.append(returned.claimed.lease)
        elif isinstance(msg, protocol.Pong):
            worker.last_rss = msg.rss
        elif isinstance(msg, protocol.Recycling):
            worker.state = WorkerState.STOPPING  # it exits now: what it holds is released then
            worker.recycling = True

    def _job_over(self, pool: Pool, worker: WorkerHandle, duration: float, now: float) -> None:
        self.freed.add(worker.pool)
        pool.job_took(duration)
        worker.jobs_done += 1
        worker.finished(now, pool.config.timeout)

    def on_exit(self, worker: WorkerHandle, status: int, now: float) -> None:
        """A worker was reaped: decide the fate of the jobs it held. Those queued behind the
        current one never started: released; so did the current one of a worker that said
        Recycling (it exits right after a result)."""
        for queued in worker.queued:
            self.releases.append(queued.claimed.lease)
        worker.queued.clear()
        job = worker.job
        if job is None:
            return
        pool = self.pools[worker.pool]
        code = status >> 8 if status & 0x7F == 0 else None
        if worker.recycling and code == exitcodes.RECYCLE:
            self.releases.append(job.claimed.lease)  # never started: hand it back untouched
            return
        if worker.kill_reason is not None and worker.kill_target != job.claimed.job_id:
            # killed for the job before it (a timeout, a lost lease, memory), whose result
            # was already in the socket: this one is not to blame
            self.releases.append(job.claimed.lease)
            return
        verdict = classify_exit(status, worker.kill_reason)
        if verdict.action == "fail":
            assert verdict.error_kind is not None
            peak = worker.last_rss
            took = max(0.0, now - job.started)
            self._failure(pool, job, verdict.error_kind, verdict.message, peak, took)
            pool.job_took(took)
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

    def flush(self, now: float, *, force: bool = False) -> None:
        """Write buffered acks, failures and releases (each list one call). Acks alone wait
        up to ``ACK_WAIT`` for company (a busy pool finishes jobs one at a time, and one
        write for many is what makes short jobs cheap), unless ``force``d, no other job is
        running (none could join them), or a pool under a fleet-wide cap is waiting for the
        room they free."""
        if now < self.store_retry_at or not (self.acks or self.fails or self.releases):
            return
        if not (
            force
            or self.fails
            or self.releases
            or len(self.acks) >= ACK_BATCH
            or now >= self.acks_due
            or any(self.pools[name].limits.capped for name in self.freed)
            or not self._running()
        ):
            return
        try:
            self._write_acks()
            self._write_fails()
            self._write_releases()
        except StoreUnavailable as exc:
            self._store_failed(now, "write results", exc)
            return
        self._store_ok()
        for name in self.freed:
            if self.pools[name].limits.capped:
                self.wake(self.pools[name])
        self.freed.clear()

    # A write the database refuses (StoreRejected) is narrowed to its row: the batch is
    # written again one row at a time, the refused row is dealt with alone, and every other
    # row is written. What is left when the store becomes unavailable stays for the retry.

    def _write_acks(self) -> None:
        if not self.acks:
            return
        try:
            self.counters.lost_leases += len(self.store.ack([a for _, a in self.acks]))
            self.acks = []
            return
        except StoreRejected:
            pass
        while self.acks:
            pool, ack = self.acks[0]
            try:
                self.counters.lost_leases += len(self.store.ack([ack]))
            except StoreRejected as exc:
                why = f"its result could not be stored ({exc}); not retried: it would be again"
                self._refused(pool, ack.lease, ErrorKind.PERMANENT, why, ack)
            self.acks.pop(0)

    def _write_fails(self) -> None:
        if not self.fails:
            return
        try:
            self._record_fails(self.store.fail([f for _, f in self.fails]), self.fails)
            self.fails = []
            return
        except StoreRejected:
            pass
        while self.fails:
            pool, failure = self.fails[0]
            try:
                self._record_fails(self.store.fail([failure]), [self.fails[0]])
            except StoreRejected as exc:
                if failure.message.startswith(_REFUSED):
                    # even the bare failure was refused: leave the lease to expire into the
                    # reaper (the job runs again; nothing is lost)
                    log.error("job %s: failure not stored: %s", failure.lease.job_id, exc)
                    self.failed.pop(failure.lease.job_id, None)
                else:
                    why = f"{failure.error_kind}; its message could not be stored ({exc})"
                    self._refused(pool, failure.lease, failure.error_kind, why, failure)
            self.fails.pop(0)

    def _write_releases(self) -> None:
        if not self.releases:
            return
        try:
            self.counters.releases += len(self.store.release(self.releases))
            self.releases = []
            return
        except StoreRejected:
            pass
        while self.releases:
            try:
                self.counters.releases += len(self.store.release(self.releases[:1]))
            except StoreRejected as exc:  # a lease holds no data of the job's: not expected
                log.error("job %s: release refused: %s", self.releases[0].job_id, exc)
            self.releases.pop(0)

    def _refused(
        self, pool: str, lease: Lease, kind: ErrorKind, why: str, was: Ack | Failure
    ) -> None:
        """Fail the job whose write was refused, alone, with a message of fleetd's own."""
        log.error("job %s: the database refused its write: %s", lease.job_id, why)
        retry = None if kind is ErrorKind.PERMANENT or isinstance(was, Ack) else was.retry_delay
        budget = None if isinstance(was, Ack) else was.budget
        failure = Failure(
            lease, kind, storable_message(_REFUSED + why), retry, was.peak_rss, was.duration, budget
        )
        self.fails.append((pool, failure))

    def _running(self) -> bool:
        """Whether any worker runs a job now (whose result could share a write)."""
        return any(w.job is not None for p in self.pools.values() for w in p.workers.values())

    def _record_fails(self, outcome, fails: list[tuple[str, Failure]]) -> None:
        self.counters.lost_leases += len(outcome.lost)
        dead, retried = set(outcome.dead), set(outcome.retried)
        deferred = set(outcome.deferred)
        written = self.clock.monotonic()  # after the write: the store's "now + delay" is earlier
        for pool, f in fails:
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

    def release_unstarted(self) -> None:
        """Hand back every job claimed but not started (drain): those in the buffer at once;
        those queued in workers as the workers return them (``Returned``), or when they exit."""
        for queue in self.buffer.values():
            self.releases.extend(item.claimed.lease for item in queue)
            queue.clear()
        for pool in self.pools.values():
            for worker in pool.workers.values():
                if worker.queued and worker.kill_reason is None:
                    with contextlib.suppress(OSError, TimeoutError):
                        worker.send(protocol.Release(), timeout=0.0)

    def running_leases(self) -> Iterator[Lease]:
        """The leases of every job sent to a worker (running or queued behind)."""
        for pool in self.pools.values():
            for worker in pool.workers.values():
                yield from (j.claimed.lease for j in worker.jobs())

    def held_leases(self) -> list[Lease]:
        """Every lease this node holds and has no result for: sent to workers or buffered."""
        buffered = [b.claimed.lease for q in self.buffer.values() for b in q]
        return [*self.running_leases(), *buffered]

    def forget_held(self) -> None:
        """Drop every job from the workers and the buffer (their leases were taken for a
        release); the workers are gone or going."""
        for queue in self.buffer.values():
            queue.clear()
        for pool in self.pools.values():
            for worker in pool.workers.values():
                worker.job = None
                worker.queued.clear()

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
        leases = [j.claimed.lease for w in held for j in w.jobs()] + [
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
                w.kill(KillReason(KillKind.LEASE_LOST, "its lease was taken over or expired"), now)
                continue
            if any(q.claimed.lease in lost for q in w.queued):
                # never start a job whose lease is gone: stop the worker before it does (its
                # running job, still ours, is released; the others too)
                self.counters.lost_leases += 1
                w.kill(KillReason(KillKind.RETIRE, "a job queued on it lost its lease"), now)
                continue
            for j in w.jobs():
                j.lease_expires, j.extensions = now + lease, j.extensions + 1
        kept = deque(b for b in self.buffer[pool.name] if b.claimed.lease not in lost)
        for b in kept:
            b.lease_expires, b.extensions = now + lease, b.extensions + 1
        self.buffer[pool.name] = kept

    def expire_unheld(self, now: float) -> None:
        """Kill workers whose lease ran out without an extension (database unreachable)."""
        for pool in self.pools.values():
            for w in pool.busy():
                if w.job is None or w.kill_reason is not None:
                    continue
                if now >= min(j.lease_expires for j in w.jobs()):
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


def _behind_long_job(worker: WorkerHandle, now: float) -> bool:
    """Its current job has run longer than ``QUEUE_BEHIND_AT_MOST``: not a short one."""
    return worker.job is not None and now - worker.job.started > QUEUE_BEHIND_AT_MOST


def _budget(ratio: float | None) -> RetryBudget | None:
    """The pool's retry budget (``retry_budget``; floor and window at their defaults)."""
    return None if ratio is None else RetryBudget(ratio)
