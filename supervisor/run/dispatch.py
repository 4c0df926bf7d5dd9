"""``Dispatcher``: moves jobs between the store and the workers, and keeps their leases.

    store ──claim (reply)──> buffer ──RunJob──> worker ──JobDone/JobFailed──> Outbox ──> store
                               │                  │                             ^
                               └── release (drain)┴── exit: classify ──fail/release┘
    decisions: whether and how much to claim (supervisor/plans.py), which buffered job goes to
    which worker (supervisor/sendplan.py); both pure, acted on here. Results and exits:
    ``JobOutcomes`` (run/outcomes.py) into the ``Outbox`` (run/outbox.py), one batch in flight.
    leases: ``LeaseKeeper`` (run/leases.py) extends them every heartbeat and kills a worker
    whose lease is lost or ran out.

Every store call is a request to a store process (run/requests.py, run/storelink.py) answered
later through the loop: one claim per pool is in flight at a time; its reply fills the buffer
and hands out at once. An idle pool arms its claim in the store process, which runs it when a
wake-up (a NOTIFY, a datagram on SQLite) names the pool (``ArmedClaim``; ``Fire``, ``Retime``
and ``Disarm`` adjust it).

Claims pass the pool's fleet-wide caps, its order between tenants (``ClaimLimits``: fair share
and weights) and its retry budget to the store, which enforces them for every host at once. A
pool with rate limits claims through ``claim_rated``
(supervisor/store/rated.py), which spends its token buckets and says when the next token is
due (``Pool.rate_gate``), so a rate-held backlog costs no polling. A retry of a job this node
failed brings the pool's poll forward to when it becomes due (so retries keep their backoff
instead of waiting for an idle pool's slow poll). Owned by the supervisor's main thread.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import random
from collections import deque
from collections.abc import Iterator
from typing import Any

from supervisor.clock import Clock
from supervisor.model import ErrorKind, Lease
from supervisor.plans import Room, claim_plan, may_claim
from supervisor.policy import KillKind, KillReason, poll_delay
from supervisor.run.counters import Counters
from supervisor.run.leases import Buffered, LeaseKeeper
from supervisor.run.link import Link, Reply
from supervisor.run.outbox import Outbox, StoreHealth
from supervisor.run.outcomes import JobOutcomes
from supervisor.run.outcomes import retry_budget as _budget
from supervisor.run.pool import Pool
from supervisor.run.requests import ArmedClaim, ClaimRated, ClaimRows, Disarm, Fire, Retime
from supervisor.run.storecalls import claimed_job
from supervisor.run.workerproc import InFlight, WorkerHandle, WorkerState
from supervisor.sendplan import UNSENDABLE, behind_long_job, send_plan, send_room
from supervisor.store.claim import ClaimRequest
from supervisor.store.rated import RatedRows
from workers import protocol


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
        # pools under a fleet-wide cap (``Pool.limits`` builds its value at each call)
        self.capped = {name for name, pool in pools.items() if pool.limits.capped}
        self.outbox = Outbox(link, self.capped, counters, self.health, clock.monotonic)
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
        self.outcomes = JobOutcomes(pools, self.outbox, clock, counters, self.rng, self._ready)
        # a worker's frames and its exit (bound once: each frame of each job comes here)
        self.on_message = self.outcomes.on_message
        self.on_exit = self.outcomes.on_exit
        # the leases' (run/leases.py), as the loop asks for them (changed in place only)
        self.heartbeat = self.leases.heartbeat
        self.expire_unheld = self.leases.expire_unheld
        self.extending = self.leases.extending
        self.next_heartbeat = self.leases.next_heartbeat

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
        """Claim for this pool's free room plus ``prefetch`` when ``plans.claim_plan`` says so
        (its poll due, or armed in the store process). Room is a worker that holds nothing,
        or, for a pool that pipelines (short jobs), what its workers may still be sent (none
        behind a job running long). One claim per pool is in flight at a time."""
        gate = pool.rate_gate()  # no token yet: the reply of the last claim said when
        if not may_claim(
            in_flight=pool.name in self.claiming, paused=pool.paused, now=now, rate_gate=gate
        ):
            return
        depth, max_jobs = pool.depth(), pool.config.max_jobs_per_worker
        rooms: list[Room] = []  # of the workers not behind a long job (nothing goes behind)
        live, booting = False, 0  # workers not stopping; of them, starting ones
        for w in pool.workers.values():  # one pass: this runs on every pass of the loop
            state = w.state
            if state != WorkerState.STOPPING:
                live = True
                booting += state == WorkerState.STARTING
            if (job := w.job) is None or not behind_long_job(w.slots, job.started, now):
                rooms.append(Room(w.room(depth, max_jobs), w.held()))
        plan = claim_plan(
            rooms,
            live=live,
            booting=booting,
            boot_failures=pool.boot_failures,
            cap=pool.running_cap(),
            depth=depth,
            slots=pool.config.slots,
            prefetch=pool.config.prefetch,
            buffered=len(self.buffer[pool.name]),
            now=now,
            store_retry_at=self.health.retry_at,
            next_poll_at=pool.next_poll_at,
            empty_claims=pool.empty_claims,
            arms_claims=self.link.arms_claims,
            capped=pool.name in self.capped,
            rated=pool.rate is not None,
            draining=self.draining,
        )
        if plan is None:
            return
        want, arm = plan
        due = self.retries_due[pool.name]
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
        """Send buffered jobs to workers with room as ``sendplan.send_plan`` places them (the
        least loaded first, in claim order); encode each frame only as the plan pulls it."""
        queue = self.buffer[pool.name]
        if not queue:
            return
        c = pool.config
        depth, max_jobs = pool.depth(), c.max_jobs_per_worker
        workers = list(pool.workers.values())
        rooms = [
            send_room(w.room(depth, max_jobs), depth, w.slots, _started(w), now) for w in workers
        ]
        frames: list[bytes | protocol.FrameTooLarge] = []
        wall = self.clock.now()

        def sizes() -> Iterator[int | None]:
            for item in queue:  # not changed until the plan is made
                cl = item.claimed
                job = protocol.RunJob(
                    cl.job_id, cl.kind, cl.payload, cl.attempt, wall + c.timeout, cl.lease.token
                )
                try:
                    frame = protocol.encode(job)
                except protocol.FrameTooLarge as exc:  # no worker could ever take it
                    frames.append(exc)
                    yield None
                else:
                    frames.append(frame)
                    yield len(frame)

        plan = send_plan(
            rooms,
            [w.held() for w in workers],
            [w.queued_bytes for w in workers],
            pool.running_cap(),  # with a spare kept: no more than the target run at once
            sizes(),
        )
        sends: dict[int, list[tuple[Buffered, bytes]]] = {}
        # one frame per job placed (the last one encoded may have found no room: it stays)
        for target, frame in zip(plan, frames, strict=False):
            item = queue.popleft()
            if target == UNSENDABLE:
                never = InFlight(item.claimed, now, now, item.lease_expires, item.extensions)
                msg = f"cannot be sent: {frame}"
                self.outcomes.fail(pool, never, ErrorKind.PERMANENT, msg, None, 0.0)
                continue
            sends.setdefault(target, []).append((item, frame))
        for index, items in sends.items():
            worker = workers[index]
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

    def _ready(self, pool: Pool, now: float) -> None:
        """A worker of ``pool`` booted: hand it what was claimed meanwhile."""
        if self.buffer[pool.name] and not self.draining:
            self.assign(pool, now)

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

    def due_at(self, *, draining: bool) -> float | None:
        """When the loop must act for the dispatcher: a heartbeat (extend), results to flush,
        an idle pool's poll; a call due during a backoff waits for its end. A timer only a
        reply moves (a claim, an extend, a write in flight) is left out: the reply wakes the
        selector, and counting it would spin the loop meanwhile."""
        retry = self.store_retry_at
        extending = self.extending
        due = [max(t, retry) for name, t in self.next_heartbeat.items() if name not in extending]
        if self.outbox.todo and self.outbox.writing is None:
            due.append(max(self.acks_due, retry))
        if draining:  # a drain claims nothing
            return min(due, default=None)
        for pool in self.pools.values():
            # a paused pool claims nothing (``claim``): its poll is no timer, else a poll
            # left due would make every wait 0 s while the pause lasts
            if pool.idle() and not pool.paused and pool.name not in self.claiming:
                # a rate-held pool claims when its next token is due (Pool.rate_gate)
                due.append(max(pool.next_poll_at, pool.rate_gate(), retry))
        return min(due, default=None)


def _started(worker: WorkerHandle) -> float | None:
    """When its current job started (None: it runs none)."""
    job = worker.job
    return None if job is None else job.started
