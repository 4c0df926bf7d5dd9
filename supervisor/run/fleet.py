"""``Fleet``: the supervisor process. One thread, one loop; its forker forks every worker.

    ┌───────────── Loop.wait(until the next timer) ─────────────┐
    │ worker frames and store replies (the loop's callbacks)    │
    │ a store process that died: fork another when due          │
    │ signals → intents (drain, skip the grace period)          │
    │ reaped workers (the forker's relays) → how each ended     │
    │ claims for the pools a wake-up named                      │
    │ watchdog → kill orders (deadline, RSS)                    │
    │ per pool: heartbeat, claim, assign                        │
    │ flush results, reap expired leases, prune                 │
    │ controls (pauses, cancels); scaling; a schedule pass      │
    │ spawn workers up to the target (with boot backoff)        │
    │ publish the node row and the snapshot; advance the drain  │
    └───────────────────────────────────────────────────────────┘

Each step belongs to an owner: ``run/children.py`` (the forker, forks, frames, reaping),
``run/stopping.py`` (drain, emergency stop, shutdown), ``run/wakeups.py``,
``run/publisher.py``, and the dispatcher, controls, scaler and scheduler. The loop waits until
the earliest instant any owner names (``due_at``). ``run/build.py`` builds the parts.

The loop never waits for the database: after boot every store call is a message to one of its
store processes (``run/storelink.py``), answered through the selector. An unexpected error in
a pass stops every worker and releases every lease before the exit (``run``'s error policy).

No thread is ever started here, so forking stays safe: the parent holds no database
connection after boot, the metrics socket is served from the loop (observe.server), and
children close what they inherit from the parent before running a job. Workers are forked by
the forker (workers/forker.py: a fresh interpreter spawned at start that imports only the
workers package and the handlers, so a fork copies little and the loop pays no copy-on-write
for it); the loop asks it through ``run/forklink.py``, once it is ready, and reads the exits it
relays.
"""

from __future__ import annotations

import logging
import signal
import socket

from supervisor.policy import KillKind
from supervisor.run import stopping, watchdog
from supervisor.run.children import Children
from supervisor.run.drain import DrainPhase
from supervisor.run.loop import Loop
from supervisor.run.parts import Parts
from supervisor.run.publisher import Publisher
from supervisor.run.wakeups import Wakeups
from workers import tree

log = logging.getLogger("fleetd.supervisor")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_LOOP_ERROR = 70  # sysexits' EX_SOFTWARE: the loop failed; every lease was handed back


class Fleet:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.children = Children(parts)
        self.wakeups = Wakeups(parts)
        self.publisher = Publisher(parts)
        self.next_watchdog = 0.0

    def run(self) -> int:
        """Boot, run until drained, return the exit status. The error policy: an unexpected
        exception in a pass is logged with its traceback, every worker is stopped and every
        lease this node holds is handed back (``stop_after_error``); it never abandons
        leases to expire."""
        self.boot()
        p = self.parts
        assert p.loop is not None
        try:
            while p.drain.phase != DrainPhase.STOPPED:
                p.loop.wait(self.next_timeout())
                now = p.clock.monotonic()
                p.processes.tick(now, p.child_cleanup)
                self.handle_signals(now)
                self.children.reap_children(now)
                self.wakeups.claim_woken(now)
                self.run_watchdog(now)
                self.dispatch(now)
                p.controls.tick(now)  # also during a drain: a cancel still stops a job
                p.scaler.tick(now, draining=p.drain.active)
                p.scheduler.tick(now, draining=p.drain.active)
                self.children.spawn(now)
                self.wakeups.reconnect(now)
                self.publisher.tick(now)
                stopping.advance_drain(p, now)
        except Exception:
            log.exception("supervisor loop failed; stopping every worker, releasing every job")
            stopping.stop_after_error(p)
            return EXIT_LOOP_ERROR
        stopping.shutdown(p)
        return 0

    def boot(self) -> None:
        p = self.parts
        self.publisher.listen_metrics()  # before the node is registered: a taken port stops
        p.observer.read_store(p.store, p.clock.monotonic())  # enqueues count from here
        p.store.register_node(
            node_id=p.node_id, hostname=socket.gethostname(), pid=p.pid, fleet=p.config.name
        )
        # the pauses before the first claim: the link's first read may fail or come late
        p.controls.start(p.store.pauses())
        self.children.start_forker()
        p.loop = Loop((*STOP_SIGNALS, signal.SIGCHLD))
        self.children.watch_forker()
        # a daemon whose worker was killed comes to us, not init: end_strays kills it
        tree.become_subreaper()
        self.children.make_scratch_root()
        p.memcg.start()
        if p.metrics is not None:
            p.metrics.attach(p.loop)
        if p.loop_wakes:
            self.wakeups.connect(p.clock.monotonic())
        if p.processes:
            p.store.close()  # no connection of the parent's may be shared with a fork
        p.link.on_wake = self.wakeups.on_wake_pools
        for process in p.processes:
            process.attach(p.loop.watch, p.loop.unwatch)
            process.start(p.child_cleanup)
        p.set_title()
        log.info(
            "fleetd supervisor %s started: %d pools, database %s",
            p.node_id,
            len(p.pools),
            p.store.dialect,
        )

    def next_timeout(self) -> float:
        """Seconds until the earliest instant an owner must act (each names its own)."""
        p = self.parts
        now = p.clock.monotonic()
        draining = p.drain.active
        due = [
            self.publisher.due_at(),
            p.dispatcher.due_at(draining=draining),
            p.controls.due_at(),
            self.children.due_at(now),
            self.watchdog_due_at(),
            p.drain.due_at(),
            self.wakeups.due_at(),
            p.processes.due_at(now),
        ]
        if not draining:  # a drain neither scales nor reaps nor runs schedules
            due += [p.scaler.due_at(), p.housekeeping.due_at(), p.scheduler.due_at()]
        earliest = min((t for t in due if t is not None), default=None)
        return 1.0 if earliest is None else max(0.0, earliest - now)

    def handle_signals(self, now: float) -> None:
        p = self.parts
        assert p.loop is not None
        for signum in p.loop.take_signals():
            if signum not in STOP_SIGNALS:
                continue  # SIGCHLD only wakes us: children are reaped every pass anyway
            phase = p.drain.on_signal(now)
            log.warning(
                "%s: %s",
                signal.Signals(signum).name,
                {
                    DrainPhase.FINISHING: f"draining (grace period {p.config.grace_period:g}s)",
                    DrainPhase.KILLING: "stopping running jobs now and releasing them",
                }.get(phase, "already stopping"),
            )
            if phase == DrainPhase.FINISHING:
                stopping.begin_drain(p, now)

    def dispatch(self, now: float) -> None:
        p = self.parts
        d = p.dispatcher
        if p.hooks.loop_fault_at is not None:  # a test seam (run/hooks.py)
            p.hooks.check_loop_fault(d.running_leases())
        d.expire_unheld(now)
        for pool in p.pools.values():
            d.heartbeat(pool, now)
            if not p.drain.active:
                d.claim(pool, now)
                d.assign(pool, now)
        d.flush(now, force=p.drain.active)
        if not p.drain.active:
            p.housekeeping.reap(now, p.reap_interval)
            p.housekeeping.prune(now, p.config.retention)

    def watchdog_due_at(self) -> float | None:
        """The next watchdog pass, while some worker has jobs to watch."""
        watched = any(pool.watched() for pool in self.parts.pools.values())
        return self.next_watchdog if watched else None

    def run_watchdog(self, now: float) -> None:
        """Every ``watchdog.PERIOD``, not every pass: a busy fleet passes far more often."""
        if now < self.next_watchdog:
            return
        self.next_watchdog = now + watchdog.PERIOD
        pools = self.parts.pools
        workers = [w for p in pools.values() for w in p.watched()]
        configs = {name: pool.config for name, pool in pools.items()}
        async_kinds = frozenset(
            (name, kind) for name, pool in pools.items() for kind in pool.async_kinds
        )
        for worker, reason in watchdog.inspect(workers, configs, now, async_kinds):
            if reason.kind == KillKind.WAIT:
                continue
            log.warning(
                "worker %s (job %s): %s",
                worker.name,
                reason.job_id or (worker.job.claimed.job_id if worker.job else "-"),
                reason.detail,
            )
            if reason.kind == KillKind.SOFT_TIMEOUT:
                worker.soft_stop(now)
            else:
                worker.kill(reason, now)
        self.parts.memcg.inspect(workers, now)
