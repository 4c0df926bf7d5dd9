"""``Controls``: what operators decide in the database, carried out on this host: pauses and
cancels (``fleetd pause`` / ``resume``, ``fleetd cancel``, ``Client.cancel``).

    every CONTROLS_EVERY, or at once on a wake-up named CONTROLS_WAKE ──> link: controls(node)
      reply: the pauses in force ──> each pool's ``paused_kinds``: the dispatcher claims only
             the other kinds; jobs of a kind just paused that are claimed and not started go
             back (buffered ones released; a worker's queued ones asked back with Release)
      reply: this node's leases whose cancel was requested ──>
             buffered or queued in a worker: released (the store makes them cancelled)
             running: CANCEL_SIGNAL to the worker (``current_job().cancel_requested``) and
             SIGTERM to its process group; after CANCEL_GRACE, SIGKILL (KillKind.CANCEL):
             the job ends cancelled, its delivery counted; the pool forks a new worker

Why a read on the ``link`` and not the lease heartbeat: an extend runs every ``heartbeat``
(a third of the lease: 20 s by default), far from "within a second", and making it more
frequent would rewrite every held row each time. This read is of a partial index of leased
rows whose cancel was asked (none, nearly always) and of the small pauses table: tens of
microseconds, a few times a second, and never behind the chores link's VACUUM. A cancel,
pause or resume also sends a wake-up (NOTIFY on PostgreSQL, the local datagram on SQLite)
so the read happens at once; the timer is the safety net for other hosts' SQLite-less
wake-ups and lost ones. One read in flight; none while the store backs off.

Owned by the supervisor's main thread.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from supervisor.clock import Clock
from supervisor.model import ControlState, Lease, Pause
from supervisor.policy import KillKind, KillReason
from supervisor.run.link import Link, Reply
from supervisor.run.outbox import StoreHealth
from supervisor.run.pool import Pool
from supervisor.run.requests import ReadControls
from workers import protocol

log = logging.getLogger("fleetd.controls")

CONTROLS_EVERY = 0.5  # seconds between reads when no wake-up comes
CANCEL_GRACE = 0.3  # seconds from SIGTERM to SIGKILL of a cancelled job


@dataclass(slots=True)
class Stopping:
    """A running job being cancelled: its worker gets SIGKILL at ``kill_at`` (monotonic)
    unless the job ended before."""

    job_id: int
    kill_at: float


class Controls:
    def __init__(
        self,
        link: Link,
        pools: dict[str, Pool],
        dispatcher: Any,
        node_id: str,
        clock: Clock,
        health: StoreHealth,
    ) -> None:
        self.link = link
        self.pools = pools
        self.dispatcher = dispatcher  # its buffer and outbox (jobs claimed, not started)
        self.node_id = node_id
        self.clock = clock
        self.health = health
        self.reading = False
        self.next_read = 0.0
        self.pauses: tuple[Pause, ...] = ()
        self.stopping: dict[int, Stopping] = {}  # worker pid -> the cancel it carries out
        self.asked: set[Lease] = set()  # cancels acted on (a read repeats them until done)

    def start(self, pauses: list[Pause]) -> None:
        """The pauses in force when the supervisor starts, read at boot on its own store
        connection (before any claim can go out): a pool paused then claims nothing even if
        the first reads on the link fail."""
        self._apply_pauses(tuple(pauses))

    def wake(self) -> None:
        """A wake-up said the controls changed: read them on this pass."""
        self.next_read = 0.0

    def due_at(self) -> float | None:
        """The next instant ``tick`` has work: a read, or a SIGKILL after a grace."""
        due = [s.kill_at for s in self.stopping.values()]
        if not self.reading:
            due.append(max(self.next_read, self.health.retry_at))
        return min(due, default=None)

    def tick(self, now: float) -> None:
        self._enforce(now)
        if self.reading or now < self.next_read or now < self.health.retry_at:
            return
        self.reading = True
        self.next_read = now + CONTROLS_EVERY
        self.link.submit(ReadControls(self.node_id), on_reply=self._read)

    def _read(self, reply: Reply) -> None:
        self.reading = False
        now = self.clock.monotonic()
        if reply.error is not None:
            self.health.failed(now, "read controls", reply.error)
            return
        self.health.ok()
        state: ControlState = reply.value
        self._apply_pauses(state.pauses)
        self._apply_cancels(state.cancels, now)

    # ---- pauses -------------------------------------------------------------------------

    def _apply_pauses(self, pauses: tuple[Pause, ...]) -> None:
        self.pauses = pauses
        for pool in self.pools.values():
            mine = [p for p in pauses if p.pool == pool.name]
            paused = frozenset(k for k in pool.kinds if any(p.covers(k) for p in mine))
            if paused == pool.paused_kinds:
                continue
            newly = paused - pool.paused_kinds
            lifted = pool.paused_kinds - paused
            pool.paused_kinds = paused
            log.warning(
                "pool %s: %s",
                pool.name,
                "paused"
                if pool.paused
                else f"paused kinds: {', '.join(sorted(paused))}"
                if paused
                else "resumed",
            )
            if newly:
                self._hold(pool, newly)
            if lifted:
                pool.next_poll_at = 0.0  # resumed (some kinds at least): claim at once

    def _hold(self, pool: Pool, kinds: frozenset[str]) -> None:
        """Nothing of ``kinds`` starts from now: buffered jobs go back, workers hand back
        what is queued behind their running job, an armed claim runs now (its reply's jobs
        of these kinds go back)."""
        d = self.dispatcher
        queue = d.buffer[pool.name]
        for item in [b for b in queue if b.claimed.kind in kinds]:
            queue.remove(item)
            d.outbox.release(item.claimed.lease)
        if pool.name in d.armed:
            d.disarm()
        for worker in pool.workers.values():
            if any(q.claimed.kind in kinds for q in worker.queued):
                _ask_back(worker)

    # ---- cancels ------------------------------------------------------------------------

    def _apply_cancels(self, cancels: tuple[Lease, ...], now: float) -> None:
        """Act on each cancel not yet carried out. A lease is ``asked`` (done with) once its
        worker was signalled or its release sent; one asked back from behind a running job
        stays open (its worker may have started it before the Release arrived: no Returned
        comes then), so every read looks again and stops it if it runs now."""
        wanted = set(cancels)
        self.asked &= wanted  # ended ones leave the read
        for lease in cancels:
            if lease not in self.asked and self._cancel(lease, now):
                self.asked.add(lease)

    def _cancel(self, lease: Lease, now: float) -> bool:
        """Carry out one cancel; False while it is still to be looked at again (asked back
        from a worker's queue: Returned, or the job started meanwhile)."""
        d = self.dispatcher
        for pool in self.pools.values():
            queue = d.buffer[pool.name]
            for item in queue:
                if item.claimed.lease == lease:  # never sent: released, so cancelled
                    queue.remove(item)
                    d.outbox.release(lease)
                    log.warning("job %s cancelled before it started", lease.job_id)
                    return True
            for worker in pool.workers.values():
                if any(j.claimed.lease == lease for j in worker.running.values()):
                    busy = self.stopping.get(worker.pid)
                    if busy is not None and busy.job_id != lease.job_id:
                        # a worker with slots has one CancelSlot: one cancel at a time; this
                        # one is looked at again next read (or released when the worker dies)
                        return False
                    self._stop(worker, lease.job_id, now)
                    return True
                if any(q.claimed.lease == lease for q in worker.queued):
                    _ask_back(worker)  # Returned, then released: cancelled, never started
                    return False
        # not held here any more (its result is on its way: the store ends it cancelled)
        return True

    def _stop(self, worker: Any, job_id: int, now: float) -> None:
        if worker.kill_reason is not None or worker.pid in self.stopping:
            return  # already dying: its end is written through the store, cancelled
        log.warning(
            "job %s cancelled while running on worker %s: stopping it (SIGKILL in %gs)",
            job_id,
            worker.name,
            CANCEL_GRACE,
        )
        worker.ask_cancel(job_id)
        self.stopping[worker.pid] = Stopping(job_id, now + CANCEL_GRACE)

    def _enforce(self, now: float) -> None:
        """SIGKILL each cancelled job's worker whose grace is over, unless the job ended
        (its result or failure is written, and the store makes it cancelled)."""
        for pid, stop in list(self.stopping.items()):
            worker = next((p.workers[pid] for p in self.pools.values() if pid in p.workers), None)
            if worker is None or stop.job_id not in worker.running:
                del self.stopping[pid]
                continue
            if now < stop.kill_at:
                continue
            del self.stopping[pid]
            worker.kill(
                KillReason(
                    KillKind.CANCEL,
                    f"cancelled by an operator while running; its worker was stopped by "
                    f"{self.node_id} ({CANCEL_GRACE:g}s after SIGTERM)",
                    stop.job_id,  # in a worker with slots: its other jobs are released
                ),
                now,
            )


def _ask_back(worker: Any) -> None:
    """Have a worker hand back the jobs queued behind its running one (``Returned``)."""
    if worker.kill_reason is None:  # else it is exiting: what it holds is released at reap
        with contextlib.suppress(OSError, TimeoutError):
            worker.send(protocol.Release(), timeout=0.0)
