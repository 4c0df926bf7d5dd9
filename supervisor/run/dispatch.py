"""``Dispatcher``: moves jobs between the store and the workers, and keeps their leases.

    store ──claim (reply)──> buffer ──RunJob──> worker ──JobDone/JobFailed──> Outbox ──> store
                               │                  │                             ^
                               └── release (drain)┴── exit: classify ──fail/release┘
    leases: ``LeaseKeeper`` (run/leases.py) extends them every heartbeat and kills a worker
    whose lease is lost or ran out; results: ``Outbox`` (run/outbox.py), one batch in flight.

Every store call is a request to a store process (run/requests.py, run/storelink.py) answered
later through the loop: one claim per pool is in flight at a time; its reply fills the buffer
and hands out at once. An idle pool arms its claim in the store process, which runs it when a
wake-up (a NOTIFY, a datagram on SQLite) names the pool (``ArmedClaim``; ``Fire``, ``Retime``
and ``Disarm`` adjust it).

Claims pass the pool's fleet-wide caps and its order between tenants (``ClaimLimits``: fair
share and weights) and retry budget to the store, which enforces them for every host at once;
failures carry the budget too. A pool with rate limits claims through ``claim_rated``
(supervisor/store/rated.py), which spends its token buckets and says when the next token is
due: no claim of that pool (or of a drained kind) goes out before then, whatever wakes it
(``Pool.rate_gate``), so a rate-held backlog costs no polling. Claims are sized by the workers'
room (an idle worker; for a pool of short jobs, what its pipeline may still hold, see
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
from typing import Any

from supervisor.clock import Clock
from supervisor.model import ErrorKind, Failure, Lease, RetryBudget
from supervisor.plans import Room, claim_size
from supervisor.policy import KillKind, KillReason, poll_delay, retry_delay
from supervisor.run.counters import Counters
from supervisor.run.exits import ExitVerdict, job_verdicts
from supervisor.run.leases import Buffered, LeaseKeeper
from supervisor.run.link import Link, Reply
from supervisor.run.outbox import Outbox, StoreHealth, log_job
from supervisor.run.pool import Pool
from supervisor.run.requests import ArmedClaim, ClaimRated, ClaimRows, Disarm, Fire, Retime
from supervisor.run.storecalls import claimed_job
from supervisor.run.workerproc import InFlight, WorkerHandle, WorkerState
from supervisor.storable import UnstorableResult, storable_message, storable_result
from supervisor.store.claim import ClaimRequest
from supervisor.store.rated import RatedRows
from supervisor.units import format_duration
from workers import exitcodes, protocol

log = logging.getLogger("fleetd.dispatch")

PIPELINE_BYTES = 64 * 1024  # frame bytes queued behind a worker's running job, at most
# nothing more is queued behind a job running longer than this: it is not a short one. Well
# above the pipeline's budget: on two cores a busy worker can go unscheduled for milliseconds
QUEUE_BEHIND_AT_MOST = 0.05
JOB_RESULTS = (protocol.JobDone, protocol.JobFailed)


class Dispatcher:
    def __init__(
        self,
        link: Link,
        pools: dict[str, Pool],
        node_id: str,
        clock: Clock,
        counters: Counters,
        rng: random.Random | None = None,
    ) -> None:
        self.link = link
        self.pools = pools
        self.node_id = node_id
        self.clock = clock
        self.counters = counters
        self.rng = rng or random.Random()
        self.health = StoreHealth(counters)
        capped = {name for name, pool in pools.items() if pool.limits.capped}
        self.outbox = Outbox(link, capped, counters, self.health, clock.monotonic)
        self.outbox.on_freed = lambda name: self.wake(self.pools[name])
        self.outbox.on_retry_due = self._retry_due
        self.buffer: dict[str, deque[Buffered]] = {name: deque() for name in pools}
        self.leases = LeaseKeeper(link, pools, self.buffer, clock, counters, self.health)
        # when jobs this node failed become claimable again (monotonic, a heap per pool): an
        # idle pool polls then, not at its adaptive poll's next slow tick
        self.retries_due = self.outbox.retries_due
        for name in pools:
            self.retries_due[name] = []
        self.claiming: set[str] = set()  # pools with a claim in flight
        self.woken: set[str] = set()  # pools woken while their claim was in flight
        self.armed: set[str] = set()  # pools whose claim waits in the store for a wake-up
        self.draining = False  # nothing more is handed out; late claims go back at once

    @property
    def store_retry_at(self) -> float:
        return self.health.retry_at

    @property
    def store_failures(self) -> int:
        return self.health.failures

    @property
    def pending_writes(self) -> int:
        return self.outbox.pending

    @property
    def acks_due(self) -> float:
        return self.outbox.acks_due

    # ---- claim and hand out ------------------------------------------------------------

    def wake(self, pool: Pool) -> None:
        """New jobs were announced for ``pool``: poll it on this pass (or, with a claim in
        flight, right after its reply: that claim may have missed them)."""
        pool.empty_claims = 0
        pool.next_poll_at = 0.0
        if pool.name in self.armed:  # the wake-up reached the loop, not the store process
            self.link.submit(Fire(pool.name), on_reply=lambda reply: None)
        if pool.name in self.claiming:  # it may have missed them: claim again after it
            self.woken.add(pool.name)

    def _retry_due(self, name: str, at: float) -> None:
        """A job this node failed becomes claimable at ``at``: poll the pool then (not at its
        adaptive poll's next slow tick); an armed claim's deadline comes forward to it (a
        retry sends no NOTIFY)."""
        pool = self.pools[name]
        pool.next_poll_at = min(pool.next_poll_at, at)
        if name in self.armed:
            wait = max(0.0, at - self.clock.monotonic())
            self.link.submit(Retime(name, wait), on_reply=lambda reply: None)

    def claim(self, pool: Pool, now: float) -> None:
        """Claim for this pool's free room plus ``prefetch`` when its poll is due. Room is a
        worker that holds nothing, or, for a pool that pipelines (short jobs), what its
        workers may still be sent (none behind a job running long); such a pool also claims
        several pipelines' worth ahead, and only once half its capacity is missing, so one
        claim serves many jobs (supervisor/plans.py). One claim per pool is in flight at a time."""
        if pool.name in self.claiming or pool.paused:  # paused: nothing of it starts
            return
        if now < pool.rate_gate():  # no token yet: the reply of the last claim said when
            return
        if not any(w.state != WorkerState.STOPPING for w in pool.workers.values()):
            return  # no worker could run what is claimed (none yet, or all stopping)
        depth, max_jobs = pool.depth(), pool.config.max_jobs_per_worker
        rooms = [
            Room(w.room(depth, max_jobs), w.held())
            for w in pool.workers.values()
            if not _behind_long_job(w, now)  # nothing goes behind it: claim nothing for it
        ]
        if pool.boot_failures == 0:  # one booting now takes a job the moment it is Ready
            rooms += [Room(1, 0) for w in pool.workers.values() if w.state == WorkerState.STARTING]
        rooms = _within_cap(rooms, pool.running_cap())
        buffered = len(self.buffer[pool.name])
        # slots run what they are sent: nothing is claimed ahead of them (a lease held idle)
        ahead = 1 if pool.config.slots > 1 else depth
        want = claim_size(rooms, depth=ahead, prefetch=pool.config.prefetch, buffered=buffered)
        if not want:
            return
        if now < self.health.retry_at:
            return
        due = self.retries_due[pool.name]
        # a pool whose last claim found nothing arms its next one in the store process, which
        # runs it the moment a wake-up names the pool (or when its poll is due): the pickup
        # saves a round trip to the loop (capped pools wake on freed room here)
        arm = (
            now < pool.next_poll_at
            and pool.empty_claims > 0
            and self.link.arms_claims
            and not pool.limits.capped
            and pool.rate is None
            and not self.draining
        )
        if now < pool.next_poll_at and not arm:
            return
        while due and due[0] <= now:  # this claim sees those retries
            heapq.heappop(due)
        c = pool.config
        limits = pool.limits
        ordered = limits.capped or limits.fair
        kinds = pool.claimable  # its kinds but the paused ones (run/controls.py)
        if pool.rate is not None:  # the store spends its tokens; kinds without one wait
            pool.rate_asked = kinds = pool.rate_kinds(now)
        claim = ClaimRequest(
            pool.name,
            kinds,
            want,
            self.node_id,
            c.lease,
            limits if ordered else None,
            _budget(c.retry_budget),
            # this node's results not sent yet, which the fair order leaves out (rated claims
            # too); not an armed claim's: those results may be written before it runs
            (self.outbox.finished(pool.name) or None) if ordered and not arm else None,
        )
        self.claiming.add(pool.name)
        if pool.rate is not None:
            request: ClaimRated | ArmedClaim | ClaimRows = ClaimRated(claim, pool.rate)
        elif arm:
            self.armed.add(pool.name)
            wait = min(pool.next_poll_at, due[0] if due else math.inf) - now
            request = ArmedClaim(claim, max(0.0, wait))
        else:
            request = ClaimRows(claim)
        self.link.submit(request, on_reply=lambda reply: self._claimed(pool, want, reply))

    def _claimed(self, pool: Pool, want: int, reply: Reply) -> None:
        self.claiming.discard(pool.name)
        self.armed.discard(pool.name)
        now = self.clock.monotonic()
        if reply.error is not None:
            self.health.failed(now, "claim", reply.error)
            return
        self.health.ok()
        rows = reply.value
        if isinstance(rows, RatedRows):
            rows = self._rate_reply(pool, rows, now)
        got = [claimed_job(row) for row in rows]
        expires = reply.started + pool.config.lease  # the lease runs out no earlier
        # an armed claim was sized when it was armed: by its reply the pool may have no
        # worker left (scaled to zero, its last one dead); what nobody can run goes back
        nobody = not any(w.state != WorkerState.STOPPING for w in pool.workers.values())
        for claimed in got:
            # hand it back untouched: a drain, nobody to run it, or its kind paused since
            # the claim was sent (an armed one waits long)
            if self.draining or nobody or claimed.kind in pool.paused_kinds:
                self.outbox.release(claimed.lease)
                continue
            self.buffer[pool.name].append(Buffered(claimed, expires))
            self.counters.claimed[pool.name] += 1
            if claimed.attempt > 1:
                self.counters.redeliveries[pool.name] += 1
        pool.empty_claims = 0 if len(got) == want else pool.empty_claims + 1
        pool.next_poll_at = now + (0.0 if len(got) == want else poll_delay(pool.empty_claims))
        if pool.rate_held and pool.rate_held_until > now:  # the pool's bucket: at its next token
            pool.empty_claims = 0
            pool.next_poll_at = pool.rate_held_until
        elif pool.rate_held and (wake := pool.rate_wake(now)):
            # only kinds wait: at their next token, or sooner at the pool's ordinary poll for
            # its other kinds (a job of theirs coming due announces itself to nobody)
            pool.next_poll_at = min(pool.next_poll_at, wake)
        due = self.retries_due[pool.name]
        if due:
            pool.next_poll_at = min(pool.next_poll_at, due[0])
        if pool.name in self.woken:  # new jobs were announced while it was in flight
            self.woken.discard(pool.name)
            pool.next_poll_at = 0.0
        if got and not self.draining:
            self.assign(pool, now)  # at once: the reply came between two passes

    @staticmethod
    def _rate_reply(pool: Pool, reply: RatedRows, now: float) -> list[Any]:
        """Note when the pool's and its kinds' next tokens are due (no claim before) and
        whether the rate held work back; the jobs claimed."""
        pool.rate_held_until = now + reply.wait if reply.wait is not None else 0.0
        # a kind this claim left out (its token not yet due) keeps its wait, and the work it
        # holds back is still held: a claim of the other kinds says nothing of it
        left_out = {k: t for k, t in pool.kind_held_until.items() if t > now}
        for kind in pool.rate_asked:
            left_out.pop(kind, None)
        pool.kind_held_until = left_out | {k: now + w for k, w in reply.kind_waits.items()}
        pool.rate_held = reply.held or bool(left_out)
        return reply.rows

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
        cap = pool.running_cap()  # with a spare kept: no more than the target run at once
        running = sum(1 for held in ahead.values() if held)
        while queue:
            open_ = [
                pid
                for pid, r in room.items()
                if r > 0 and (cap is None or ahead[pid] or running < cap)
            ]
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
            running += not ahead[pid]
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
        if worker.slots > 1:  # a free slot runs at once: no pipeline to top up
            return room
        if worker.job is not None and (room * 2 < depth or _behind_long_job(worker, now)):
            return 0
        return room

    # ---- results and exits -------------------------------------------------------------

    def on_message(self, worker: WorkerHandle, msg: protocol.Message, now: float) -> None:
        pool = self.pools[worker.pool]
        job = worker.running.get(msg.job_id) if isinstance(msg, JOB_RESULTS) else None
        if isinstance(msg, protocol.Ready) and worker.state == WorkerState.STARTING:
            worker.state = WorkerState.IDLE
            pool.boot_failures = 0
            if self.buffer[pool.name] and not self.draining:
                self.assign(pool, now)  # claimed while it booted: a fresh worker per job
                # waits for no pass
        elif isinstance(msg, protocol.JobDone) and job:
            try:
                result = storable_result(msg.result)
            except UnstorableResult as exc:
                self._failure(pool, job, ErrorKind.PERMANENT, str(exc), msg.peak_rss, msg.duration)
                self._job_over(pool, worker, msg.duration, now, msg.job_id)
                return
            lease = job.claimed.lease
            row = (pool.name, lease.job_id, lease.token, result, msg.peak_rss, msg.duration)
            self.outbox.ack(pool.name, row, now, job.claimed.tenant)
            self.counters.job_finished(pool.name, "done", msg.duration, msg.peak_rss, now)
            if job.claimed.attempt > 1:  # a success, but not a plain one: say so once
                log_job(
                    logging.INFO,
                    "job_recovered",
                    job.claimed,
                    pool.name,
                    msg.duration,
                    msg.peak_rss,
                    None,
                    "done",
                )
            self._job_over(pool, worker, msg.duration, now, msg.job_id)
        elif isinstance(msg, protocol.JobFailed) and job:
            kind = ErrorKind(msg.error_kind)
            soft = worker.soft_target
            if kind is ErrorKind.TIMEOUT and soft is not None and soft != msg.job_id:
                # the SoftTimeout meant for the job before it, whose result was already on
                # its way, landed in this one: not its failure
                self.outbox.release(job.claimed.lease)
                self._job_over(pool, worker, msg.duration, now, msg.job_id)
                return
            message = storable_message(msg.message)  # a handler's text: NUL, surrogates, size
            if kind is ErrorKind.TIMEOUT and soft == msg.job_id:  # else a command's own stop
                message = (
                    f"ran past its timeout of {format_duration(pool.config.timeout)}; "
                    "the handler stopped on SoftTimeout"
                )
            self._failure(pool, job, kind, message, msg.peak_rss, msg.duration)
            self._job_over(pool, worker, msg.duration, now, msg.job_id)
        elif isinstance(msg, protocol.Returned):
            returned = worker.returned(msg.job_id, now, pool.config.timeout)
            if returned is not None:
                self.outbox.release(returned.claimed.lease)
        elif isinstance(msg, protocol.Pong):
            worker.last_rss = msg.rss
        elif isinstance(msg, protocol.Recycling):
            worker.state = WorkerState.STOPPING  # it exits now: what it holds is released then
            worker.recycling = True

    def _job_over(
        self, pool: Pool, worker: WorkerHandle, duration: float, now: float, job_id: int
    ) -> None:
        pool.job_took(duration)
        worker.jobs_done += 1
        worker.finished(now, pool.config.timeout, job_id)

    def on_exit(self, worker: WorkerHandle, status: int, now: float) -> None:
        """A worker was reaped: decide the fate of the jobs it held. Those queued behind the
        running ones never started: released; so did the running ones of a worker that said
        Recycling (it exits only after its results). The running ones: ``job_verdicts``
        (the kill's target gets its kind; the others are released, uncounted)."""
        for queued in worker.queued:
            self.outbox.release(queued.claimed.lease)
        worker.queued.clear()
        if not worker.running:
            return
        pool = self.pools[worker.pool]
        code = status >> 8 if status & 0x7F == 0 else None
        running = dict(worker.running)
        worker.running.clear()
        if worker.recycling and code == exitcodes.RECYCLE:
            for job in running.values():  # never started: hand it back untouched
                self.outbox.release(job.claimed.lease)
            return
        deadlines = {job_id: job.deadline for job_id, job in running.items()}
        verdicts = job_verdicts(status, worker.kill_reason, worker.kill_target, deadlines, now)
        for job_id, job in running.items():
            self._apply_verdict(pool, worker, job, verdicts[job_id], now)

    def _apply_verdict(
        self, pool: Pool, worker: WorkerHandle, job: InFlight, verdict: ExitVerdict, now: float
    ) -> None:
        if verdict.action == "fail":
            assert verdict.error_kind is not None
            peak = worker.last_rss
            took = max(0.0, now - job.started)
            self._failure(pool, job, verdict.error_kind, verdict.message, peak, took)
            pool.job_took(took)
        elif verdict.action == "release":
            self.outbox.release(job.claimed.lease)
        elif verdict.action == "cancel":  # the store makes its end cancelled, counted
            took = max(0.0, now - job.started)
            failure = Failure(job.claimed.lease, None, verdict.message, None, worker.last_rss, took)
            self.outbox.fail(pool.name, failure, job.claimed)
            self.counters.job_finished(pool.name, "cancelled", took, worker.last_rss, now)
            log_job(
                logging.WARNING,
                "job_cancelled",
                job.claimed,
                pool.name,
                took,
                worker.last_rss,
                None,
                verdict.message,
            )
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
        self.outbox.fail(pool.name, failure, job.claimed)
        self.counters.job_finished(pool.name, str(kind), duration, peak, self.clock.monotonic())
        log_job(
            logging.INFO, "job_failed", job.claimed, pool.name, duration, peak, str(kind), message
        )

    # ---- writing back ------------------------------------------------------------------

    def flush(self, now: float, *, force: bool = False) -> None:
        """Write buffered results (``Outbox.flush``): acks may wait a little for company
        while other jobs run, unless ``force``d (a drain)."""
        self.outbox.flush(now, force=force, running=self._running())

    def _running(self) -> bool:
        """Whether any worker runs a job now (whose result could share a write)."""
        return any(w.job is not None for p in self.pools.values() for w in p.workers.values())

    def release_unstarted(self) -> None:
        """Hand back every job claimed but not started (drain): those in the buffer at once;
        those queued in workers as the workers return them (``Returned``), or when they exit;
        those of a claim still in flight when its reply comes."""
        self.draining = True
        self.disarm()
        for queue in self.buffer.values():
            for item in queue:
                self.outbox.release(item.claimed.lease)
            queue.clear()
        for pool in self.pools.values():
            for worker in pool.workers.values():
                if worker.queued and worker.kill_reason is None:
                    with contextlib.suppress(OSError, TimeoutError):
                        worker.send(protocol.Release(), timeout=0.0)

    def disarm(self) -> None:
        """Have every armed claim run now (a drain, an emergency stop): their replies come
        at once, and what they took is released, instead of up to a poll interval later."""
        if self.armed:
            self.link.submit(Disarm(), on_reply=lambda reply: None)

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
                worker.running.clear()
                worker.queued.clear()

    # ---- leases (supervisor/run/leases.py) ------------------------------------------

    def heartbeat(self, pool: Pool, now: float) -> None:
        self.leases.heartbeat(pool, now)

    def expire_unheld(self, now: float) -> None:
        self.leases.expire_unheld(now)

    @property
    def extending(self) -> set[str]:
        return self.leases.extending

    @property
    def next_heartbeat(self) -> dict[str, float]:
        return self.leases.next_heartbeat


def _within_cap(rooms: list[Room], cap: int | None) -> list[Room]:
    """The rooms a claim may fill when at most ``cap`` workers may hold jobs (a pool that
    keeps a spare): every busy worker's, and idle ones' only up to the cap."""
    if cap is None:
        return rooms
    busy = [r for r in rooms if r.held]
    idle = [r for r in rooms if not r.held][: max(0, cap - len(busy))]
    return busy + idle


def _behind_long_job(worker: WorkerHandle, now: float) -> bool:
    """Its current job has run longer than ``QUEUE_BEHIND_AT_MOST``: not a short one (a
    worker with slots runs what it is sent: nothing waits behind)."""
    return (
        worker.slots == 1
        and worker.job is not None
        and now - worker.job.started > QUEUE_BEHIND_AT_MOST
    )


def _budget(ratio: float | None) -> RetryBudget | None:
    """The pool's retry budget (``retry_budget``; floor and window at their defaults)."""
    return None if ratio is None else RetryBudget(ratio)
