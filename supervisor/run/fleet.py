"""``Fleet``: the supervisor process. One thread, one loop; its forker forks every worker.

    ┌───────────── Loop.wait(until the next timer) ─────────────┐
    │ worker frames and store replies (the loop's callbacks)    │
    │ a store process that died: fork another when due          │
    │ signals → intents (drain, skip the grace period)          │
    │ reaped workers (the forker's relays) → how each ended     │
    │ watchdog → kill orders (deadline, RSS)                    │
    │ per pool: heartbeat, claim, assign                        │
    │ flush results, reap expired leases, publish the node row  │
    │ a schedule pass when the next tick is due                 │
    │ spawn workers up to the target (with boot backoff)        │
    └───────────────────────────────────────────────────────────┘

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

import contextlib
import dataclasses
import logging
import os
import random
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psutil
from setproctitle import setproctitle

from supervisor import host
from supervisor.clock import Clock, SystemClock
from supervisor.config.fleet import FleetConfig
from supervisor.errors import FleetdError
from supervisor.imports import handler_refs
from supervisor.observe.observer import Observer
from supervisor.observe.server import MetricsServer
from supervisor.policy import KillKind, KillReason, backoff_cap
from supervisor.run import watchdog
from supervisor.run.controls import Controls
from supervisor.run.counters import Counters
from supervisor.run.dispatch import Dispatcher
from supervisor.run.drain import Drain, DrainPhase
from supervisor.run.forklink import BOOT_LIMIT, ForkerGone, ForkFailed, ForkLink, start_forker
from supervisor.run.housekeeping import Housekeeping
from supervisor.run.link import Link, Reply, StoreBug
from supervisor.run.loop import Loop
from supervisor.run.memcg import MemoryCgroups
from supervisor.run.pinger import Pinger
from supervisor.run.pool import Pool
from supervisor.run.requests import NodeHeartbeat
from supervisor.run.scaler import Scaler
from supervisor.run.scheduler import Scheduler
from supervisor.run.storelink import CALL_LIMIT, ProcessLink
from supervisor.run.storeserve import StoreWrapper
from supervisor.run.workerproc import WorkerHandle, WorkerState
from supervisor.store import Store
from supervisor.store.wake import CONTROLS_WAKE
from workers import protocol, scratch, tree
from workers.forker import ended_abnormally

log = logging.getLogger("fleetd.supervisor")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PUBLISH_EVERY = 1.0
FORKER_PAUSE = 1.0  # seconds between the start of a forker and that of the next
# ... doubled for each forker in a row that stopped before it was ready (its imports fail:
# each try imports every handler again), up to this
FORKER_PAUSE_AT_MOST = 60.0
EXIT_LOOP_ERROR = 70  # sysexits' EX_SOFTWARE: the loop failed; every lease was handed back
WRITE_PATIENCE = 10.0  # seconds an emergency stop keeps trying to write what it holds


class Fleet:
    def __init__(
        self,
        config: FleetConfig,
        store: Store,
        handlers: dict[str, dict[str, Callable[[Any], Any]]],
        node_id: str | None = None,
        clock: Clock | None = None,
        link: Link | None = None,
        forker: ForkLink | None = None,
        wrap_store: StoreWrapper | None = None,
    ) -> None:
        self.config = config
        self.handlers = handlers
        # started by boot.run before the heavy imports (it stays small); else at our boot
        self.forker = forker
        self.forker_due = 0.0  # when a forker that died may be started again
        self.forkers_broken = 0  # forkers in a row that stopped before they were ready
        self.handler_refs = handler_refs(config)  # the names each forker imports them by
        # seconds a forker may take to import the handlers (the first one's, from boot)
        self.forker_boot_limit = forker.boot_limit if forker is not None else BOOT_LIMIT
        self.store = store  # at boot only (migrated, node registered); then every call
        # goes through a link to a process of the supervisor's own, so the loop never waits
        # for the database: ``link`` for the jobs (claims, extends, results; wake-ups), and
        # ``chores`` for what may take long (the reaper and its VACUUM, prune, the figures,
        # the node row), so an extend never queues behind a slow chore
        # (``wrap_store``: what their store processes run requests against, made of the store
        # each opens; a test's seam, to make a verb fail)
        self.link: Link = link or ProcessLink(
            config.database, title=config.name, listen=True, wrap_store=wrap_store
        )
        self.chores: Link = link or ProcessLink(
            config.database, title=f"{config.name} chores", listen=False, wrap_store=wrap_store
        )
        self.processes = [p for p in (self.link, self.chores) if isinstance(p, ProcessLink)]
        # wake-ups reach the link's store process (LISTEN; SQLite's datagram socket), which
        # runs an armed claim at once: the loop binds SQLite's socket itself only without one
        self.loop_wakes = store.dialect == "sqlite" and not isinstance(self.link, ProcessLink)
        self.clock = clock or SystemClock()
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
        self.pid = os.getpid()
        self.pools = {
            name: Pool(pool_config, handlers[name], self.pid)
            for name, pool_config in config.pools.items()
        }
        self.counters = Counters()
        self.dispatcher = Dispatcher(self.link, self.pools, self.node_id, self.clock, self.counters)
        self.housekeeping = Housekeeping(
            self.chores, self.clock, self.counters, self.dispatcher.health
        )
        # pauses and cancels, read on the link several times a second (run/controls.py)
        self.controls = Controls(
            self.link, self.pools, self.dispatcher, self.node_id, self.clock, self.dispatcher.health
        )
        self.scheduler = Scheduler(
            self.chores, config.schedule_specs(), self.clock, self.dispatcher.health
        )
        self.drain = Drain(config.grace_period)
        self.memcg = MemoryCgroups(enabled=config.memory_cgroup, pid=self.pid)
        self.loop: Loop | None = None
        self.scratch_root: str | None = None  # made at boot (make_scratch_root)
        self.waker: Any = None
        self.next_waker_at = 0.0
        self.woken_pools: set[str] = set()  # pools a wake-up named since the last pass
        self.next_publish = 0.0
        self.next_watchdog = 0.0
        self.reap_interval = min(10.0, max(0.5, min(p.lease for p in config.pools.values()) / 4))
        self.scaler = Scaler(
            self.chores,
            self.pools,
            cores=host.usable_cores(),
            memory_budget=config.memory_budget.bytes_of(host.total_memory()),
            interval=config.scale_interval,
            started=self.clock.monotonic(),
        )
        self.rng = random.Random()
        self.observer = Observer(
            config,
            node_id=self.node_id,
            hostname=socket.gethostname(),
            pid=self.pid,
            clock=self.clock,
        )
        self.pinger = Pinger()
        self.metrics: MetricsServer | None = None
        self.heartbeat_in_flight = False

    # ---- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        """Boot, run until drained, return the exit status. The error policy: an unexpected
        exception in a pass is logged with its traceback, every worker is stopped and every
        lease this node holds is handed back (``stop_after_error``); it never abandons
        leases to expire."""
        self.boot()
        assert self.loop is not None
        try:
            while self.drain.phase != DrainPhase.STOPPED:
                self.loop.wait(self.next_timeout())
                now = self.clock.monotonic()
                self.tick_links(now)
                self.handle_signals(now)
                self.reap_children(now)
                self.claim_woken(now)
                self.run_watchdog(now)
                self.dispatch(now)
                self.controls.tick(now)  # also during a drain: a cancel still stops a job
                self.scaler.tick(now, draining=self.drain.active)
                self.scheduler.tick(now, draining=self.drain.active)
                self.spawn(now)
                self.publish(now)
                self.advance_drain(now)
        except Exception:
            log.exception("supervisor loop failed; stopping every worker, releasing every job")
            self.stop_after_error()
            return EXIT_LOOP_ERROR
        self.shutdown()
        return 0

    def boot(self) -> None:
        self.listen_metrics()  # before the node is registered: a taken port stops the start
        self.observer.read_store(self.store, self.clock.monotonic())  # enqueues count from here
        self.store.register_node(
            node_id=self.node_id,
            hostname=socket.gethostname(),
            pid=self.pid,
            fleet=self.config.name,
        )
        # the pauses before the first claim: the link's first read may fail or come late
        self.controls.start(self.store.pauses())
        if self.forker is None:
            self.forker = start_forker(self.handlers, self.handler_refs)
        self.loop = Loop((*STOP_SIGNALS, signal.SIGCHLD))
        self.watch_forker()
        # a daemon whose worker was killed comes to us, not init: end_strays kills it
        tree.become_subreaper()
        self.make_scratch_root()
        self.memcg.start()
        if self.metrics is not None:
            self.metrics.attach(self.loop)
        if self.loop_wakes:
            self.connect_waker(self.clock.monotonic())
        if self.processes:
            self.store.close()  # no connection of the parent's may be shared with a fork
        self.link.on_wake = self.on_wake_pools
        for process in self.processes:
            process.attach(self.loop.watch, self.loop.unwatch)
            process.start(self.child_cleanup)
        self.set_title()
        log.info(
            "fleetd supervisor %s started: %d pools, database %s",
            self.node_id,
            len(self.pools),
            self.store.dialect,
        )

    def make_scratch_root(self) -> None:
        """The directory of the workers' job folders (workers.scratch); those of supervisors
        that are gone are removed. Without it, jobs use the temp directory itself."""
        try:
            root, removed = scratch.make_root(tempfile.gettempdir(), self.pid)
        except OSError as exc:
            log.warning("no directory for job folders (%s): a killed job's folder stays", exc)
            return
        for path in removed:
            log.info("removed %s, left by a supervisor that is gone", path)
        self.scratch_root = root
        for pool in self.pools.values():
            pool.scratch_root = root

    def handle_signals(self, now: float) -> None:
        assert self.loop is not None
        for signum in self.loop.take_signals():
            if signum not in STOP_SIGNALS:
                continue  # SIGCHLD only wakes us: children are reaped every pass anyway
            phase = self.drain.on_signal(now)
            log.warning(
                "%s: %s",
                signal.Signals(signum).name,
                {
                    DrainPhase.FINISHING: f"draining (grace period {self.config.grace_period:g}s)",
                    DrainPhase.KILLING: "stopping running jobs now and releasing them",
                }.get(phase, "already stopping"),
            )
            if phase == DrainPhase.FINISHING:
                self.begin_drain(now)

    def dispatch(self, now: float) -> None:
        d = self.dispatcher
        _injected_fault(d)
        d.expire_unheld(now)
        for pool in self.pools.values():
            d.heartbeat(pool, now)
            if not self.drain.active:
                d.claim(pool, now)
                d.assign(pool, now)
        d.flush(now, force=self.drain.active)
        if not self.drain.active:
            self.housekeeping.reap(now, self.reap_interval)
            self.housekeeping.prune(now, self.config.retention)

    def next_timeout(self) -> float:
        """Seconds until the earliest timer: watchdog, polls, heartbeats, spawns, drain."""
        now = self.clock.monotonic()
        d = self.dispatcher
        # a timer that only a reply moves (a claim, an extend, a write in flight) is left
        # out: the reply wakes the selector, and counting it would spin the loop meanwhile
        due = [
            self.next_publish,
            *(
                max(t, d.store_retry_at)  # a call due during a backoff waits for its end
                for name, t in d.next_heartbeat.items()
                if name not in d.extending
            ),
        ]
        if not self.drain.active:  # a drain neither scales nor reaps: their timers stand
            if not self.scaler.reading:
                due.append(self.scaler.next_eval)
            if not self.housekeeping.reaping:
                due.append(max(self.housekeeping.next_reap, d.store_retry_at))
            if (pass_at := self.scheduler.due_at()) is not None:
                due.append(pass_at)
        if d.outbox.todo and d.outbox.writing is None:
            due.append(max(d.acks_due, d.store_retry_at))
        for pool in self.pools.values():
            if pool.watched():
                due.append(self.next_watchdog)
            # a paused pool claims nothing (Dispatcher.claim): its poll is no timer, else
            # a poll left due would make every wait 0 s while the pause lasts
            if (
                pool.idle()
                and not pool.paused
                and not self.drain.active
                and pool.name not in d.claiming
            ):
                # a rate-held pool claims when its next token is due (Pool.rate_gate)
                due.append(max(pool.next_poll_at, pool.rate_gate(), d.store_retry_at))
            if pool.live() < pool.wanted():
                due.append(max(pool.next_spawn_at, self.forker_due_at()))
        if self.drain.phase == DrainPhase.FINISHING:
            due.append(self.drain.deadline)
        if self.waker is None and self.loop_wakes:
            due.append(self.next_waker_at)
        if (controls_at := self.controls.due_at()) is not None:
            due.append(controls_at)
        if self.forker is not None and self.forker.exits:  # read already: reap them now
            due.append(now)
        due.extend(self.link_timers(now))
        return max(0.0, min(due) - now) if due else 1.0

    # ---- workers -----------------------------------------------------------------------

    def spawn(self, now: float) -> None:
        """Fork up to each pool's target, a small random stagger apart (forty cold starts at
        once are a load spike of their own), except a replacement for a worker that retired
        after its job (max_jobs_per_worker, recycle_rss): forked at once, since a pool that
        recycles after every job would otherwise wait for the stagger on every job. Retire
        idle workers above the target."""
        if self.drain.active:
            return
        for pool in self.pools.values():
            if pool.spawn_due(now) and self.forker_ready(now):
                replacing = pool.take_replacement()  # for a worker that retired: no stagger
                if not self.fork(pool, now):
                    continue
                if not replacing:
                    pool.next_spawn_at = max(pool.next_spawn_at, now + self.rng.uniform(0, 0.05))
                else:  # claim its job while it boots: it gets it the moment it is Ready
                    self.dispatcher.claim(pool, now)
            for worker in pool.idle()[: max(0, pool.live() - pool.wanted())]:
                worker.kill(KillReason(KillKind.RETIRE, "scaled in"), now)

    def fork(self, pool: Pool, now: float) -> bool:
        """Have the forker fork one worker of ``pool``; whether it did."""
        assert self.loop is not None and self.forker is not None
        spec = pool.spec()
        # the worker joins its cgroup itself, before Ready (so before any job is sent)
        prepared = self.memcg.prepare(spec.pool, spec.slot, pool.config.memory_limit)
        try:
            worker = self.forker.fork_worker(
                spec, now=now, cgroup_fd=prepared.fd if prepared is not None else None
            )
        except (ForkFailed, ForkerGone) as exc:
            if prepared is not None:
                self.memcg.abandon(prepared)
            if isinstance(exc, ForkerGone):
                self.forker_gone(now, str(exc))
            else:  # a failed fork (EAGAIN, ENOMEM) counts as a worker that died at boot
                log.warning("pool %s: could not fork a worker: %s", pool.name, exc)
                pool.boot_failed(now)
            return False
        self.memcg.adopt(worker, prepared)
        pool.workers[worker.pid] = worker
        self.loop.watch(worker.fd, lambda w=worker: self.read_worker(w))
        self.set_title()
        return True

    # ---- the forker --------------------------------------------------------------------

    def watch_forker(self) -> None:
        assert self.loop is not None and self.forker is not None
        fd = self.forker.fileno()
        if fd is not None:
            self.loop.watch(fd, self.on_forker)

    def forker_ready(self, now: float) -> bool:
        """A forker to ask: the one running once it has imported the handlers, or a new one
        once a dead one's pause is over (asked from the next pass on, when it is ready)."""
        if self.forker is not None:
            limit = self.forker.boot_limit
            if not self.forker.ready and now >= self.forker.started_at + limit:
                self.forker_gone(now, f"it did not import the handlers in {limit:g}s")
                return False
            return self.forker.ready
        if now < self.forker_due:
            return False
        try:
            self.forker = start_forker(
                self.handlers, self.handler_refs, boot_limit=self.forker_boot_limit
            )
        except (OSError, ValueError) as exc:  # EAGAIN, ENOMEM, EMFILE: no fork until the next try
            self.forker_due = now + FORKER_PAUSE
            log.error("could not start a forker (%s); next try in %gs", exc, FORKER_PAUSE)
            return False
        self.forker.started_at = now  # its boot limit and pause run on the loop's clock
        self.watch_forker()
        log.info("forker started again (pid %d)", self.forker.pid)
        return False

    def forker_due_at(self) -> float:
        """When a fork can next be asked for: a new forker's start, or the bound on a booting
        one's imports (its ``ready`` wakes the loop through its socket before that)."""
        if self.forker is None:
            return self.forker_due
        if not self.forker.ready:
            return self.forker.started_at + self.forker.boot_limit
        return 0.0

    def on_forker(self) -> None:
        """Workers that ended, as the forker relays them; its end closed: it is gone."""
        forker = self.forker
        assert forker is not None and self.loop is not None
        fd = forker.fileno()
        now = self.clock.monotonic()
        for pid, status in forker.take_exits():
            self.worker_reaped(pid, status, now)
            forker.reaped(pid)  # forgotten here: from now on its pid may name another process
        if forker.gone:
            if fd is not None:
                self.loop.unwatch(fd)
            self.forker_gone(now, forker.broken or "it closed its end")

    def forker_gone(self, now: float, why: str) -> None:
        """The forker died or broke: its workers die with it (PR_SET_PDEATHSIG), come to us
        (a subreaper) and are reaped here; their jobs are released untouched. The exits it
        relayed before it died are read first and keep their status (a crash stays a
        crash); one whose exit it took with it is forgotten as killed. Another forker is
        started, at most once a second."""
        forker, self.forker = self.forker, None
        assert forker is not None
        if forker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(forker.pid, signal.SIGKILL)
        if self.loop is not None and (fd := forker.fileno()) is not None:
            self.loop.unwatch(fd)
        status = forker.wait(1.0)  # dead, so its socket holds all it will ever relay
        for pid, relayed in forker.take_exits():
            self.worker_reaped(pid, relayed, now)
        forker.close_socket()
        self.forkers_broken = 0 if forker.ready else self.forkers_broken + 1
        pause = backoff_cap(self.forkers_broken, FORKER_PAUSE, FORKER_PAUSE_AT_MOST)
        self.forker_due = max(now, forker.started_at + pause)
        log.error(
            "the forker stopped (%s; status %s): its workers are stopped; the next in %.3gs",
            why,
            status,
            self.forker_due - now,
        )
        for pool in self.pools.values():
            for worker in list(pool.workers.values()):
                worker.record_kill(KillReason(KillKind.RETIRE, "the forker stopped"), now)
                if not _is_child(worker.pid):  # reaped by the forker, exit not relayed
                    self.worker_reaped(worker.pid, signal.SIGKILL, now)

    def link_timers(self, now: float) -> list[float]:
        """When the link needs the loop: a store process to fork again, frames the kernel
        did not take yet, the bound on an unanswered call."""
        due: list[float] = []
        for process in self.processes:
            if process.pid is None:
                due.append(process.respawn_at)
                continue
            since = process.waiting_since()
            if since is not None and not process.killed:  # killed: its reaping wakes the loop
                due.append(since + CALL_LIMIT)
            if process.outbox:
                due.append(now + 0.01)
        return due

    def tick_links(self, now: float) -> None:
        for process in self.processes:
            process.tick(now, self.child_cleanup)

    def store_waiting_since(self) -> float | None:
        """When the oldest call still unanswered by a store process was sent."""
        times = [t for p in (self.link, self.chores) if (t := p.waiting_since()) is not None]
        return min(times, default=None)

    def child_cleanup(self) -> None:
        """In a new worker or store process: close the parent's loop, sockets and wake-up
        channel."""
        if self.loop is not None:
            self.loop.reset_in_child()
        for process in self.processes:
            if process.sock is not None:
                process.sock.close()
        if self.forker is not None:
            self.forker.close_socket()
            self.forker.pid = None  # not this process's child: never waited for here
        for pool in self.pools.values():
            for other in pool.workers.values():
                other.sock.close()
                if other.cancel_slot is not None:
                    other.cancel_slot.close()  # a sibling's: never written here
                    other.cancel_slot = None
        if self.waker is not None:
            with contextlib.suppress(OSError):
                os.close(self.waker.fileno())
        if self.metrics is not None:
            self.metrics.close_in_child()

    def read_worker(self, worker: WorkerHandle, now: float | None = None) -> None:
        """Handle every frame the worker has written so far, in order (a result makes the next
        job of a pipeline current)."""
        assert self.loop is not None
        try:
            messages, eof = worker.reader.drain(worker.fd)
        except (protocol.ProtocolError, OSError) as exc:
            # a reset from a worker this supervisor stopped is expected; from any other it
            # comes with an exit the classifier reports, so this line only adds the detail
            stopped = worker.kill_reason is not None or worker.state == WorkerState.STOPPING
            level = logging.DEBUG if stopped else logging.WARNING
            log.log(level, "worker %s: broken frame: %s", worker.name, exc)
            messages, eof = [], True
        now = self.clock.monotonic() if now is None else now
        self.pinger.on_messages(worker, messages, now)
        for msg in messages:
            # in a worker with slots the kill is about the job that failed, not the oldest
            about = msg.job_id if isinstance(msg, protocol.JobFailed) and worker.slots > 1 else None
            if isinstance(msg, protocol.JobFailed) and self.memcg.failed_by_oom(worker, now, about):
                # a process of its job was OOM-killed: the worker is stopped, and the failure
                # is that kill's (the frames after it are still results of later jobs)
                detail = worker.kill_reason.detail if worker.kill_reason else msg.message
                msg = dataclasses.replace(msg, error_kind=protocol.MEMORY_LIMIT, message=detail)
            self.dispatcher.on_message(worker, msg, now)
        if eof:  # the worker is exiting; SIGCHLD brings its status
            self.loop.unwatch(worker.fd)

    def reap_children(self, now: float) -> None:
        """Workers the forker reaped (relayed while the loop waited for a fork's answer, so
        no readable socket calls ``on_forker`` for them); then our own children: the store
        processes, the forker, what a dead worker's job left (``end_strays``) and, after the
        forker died, its workers."""
        if self.forker is not None and self.forker.exits:
            self.on_forker()
        while True:
            try:  # look first (WNOWAIT): the zombie keeps its process group's id reserved
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            code = info.si_status if info.si_code == os.CLD_EXITED else None
            if ended_abnormally(code) and any(
                info.si_pid in p.workers for p in self.pools.values()
            ):
                # as the forker does (workers/forker.py): the job's processes die with it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(info.si_pid, signal.SIGKILL)
            pid, status = os.waitpid(info.si_pid, 0)
            process = next((p for p in self.processes if p.pid == pid), None)
            if process is not None:
                process.exited(status, now)
            elif self.forker is not None and pid == self.forker.pid:
                self.forker.pid = None
                self.forker_gone(now, f"it exited, wait status {status}")
            else:
                self.worker_reaped(pid, status, now)

    def worker_reaped(self, pid: int, status: int, now: float) -> None:
        """A worker ended (the forker relayed it, or it was our child): its job's strays
        are killed if it died abnormally, then its pool hears of it."""
        for pool in self.pools.values():
            worker = pool.workers.get(pid)
            if worker is not None:
                code = os.waitstatus_to_exitcode(status)
                if ended_abnormally(code if code >= 0 else None):
                    self.end_strays()
                self.worker_exited(pool, worker, status, now)
                return

    def end_strays(self) -> None:
        """Kill what a dead worker's job left that escaped its process group (a daemon that
        called setsid): the supervisor is a subreaper, so it was re-parented to us. Any child
        that is neither a worker nor a store process is such a stray."""
        known = {pid for p in self.pools.values() for pid in p.workers}
        known.update(p.pid for p in self.processes if p.pid is not None)
        if self.forker is not None and self.forker.pid is not None:
            known.add(self.forker.pid)
        for pid in tree.children(self.pid):
            if pid not in known:
                tree.end_all(root=pid)
                tree.signal_all([pid], signal.SIGKILL)

    def worker_exited(self, pool: Pool, worker: WorkerHandle, status: int, now: float) -> None:
        assert self.loop is not None
        booted = worker.state != WorkerState.STARTING
        self.read_worker(worker, now)  # its last frames (results may precede its death)
        self.loop.unwatch(worker.fd)
        worker.sock.close()
        if worker.cancel_slot is not None:
            worker.cancel_slot.close()
            worker.cancel_slot = None
        self.memcg.worker_exited(worker, status, now)  # a kernel OOM kill becomes memory_limit
        if worker.kill_reason is not None:
            self.counters.worker_kills[(pool.name, worker.kill_reason.kind)] += 1
        elif not booted:
            self.counters.worker_boot_failures += 1
        self.dispatcher.on_exit(worker, status, now)
        self.pinger.forget(worker.pid)
        if pool.scratch_root is not None and pool.runs_commands:
            # its job folders, even one of a job it was killed in (local disk: quick); only
            # command jobs make them (with max_jobs_per_worker = 1 an rmtree every worker
            # was a fifth of the loop's samples, py-spy)
            scratch.remove(
                scratch.worker_dir(pool.scratch_root, pool.name, worker.slot, worker.pid)
            )
        pool.worker_gone(worker, booted, now)
        self.set_title()

    def run_watchdog(self, now: float) -> None:
        """Every ``watchdog.PERIOD``, not every pass: a busy fleet passes far more often."""
        if now < self.next_watchdog:
            return
        self.next_watchdog = now + watchdog.PERIOD
        workers = [w for p in self.pools.values() for w in p.watched()]
        configs = {name: pool.config for name, pool in self.pools.items()}
        async_kinds = frozenset(
            (name, kind) for name, pool in self.pools.items() for kind in pool.async_kinds
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
        self.memcg.inspect(workers, now)

    # ---- draining and stopping ---------------------------------------------------------

    def begin_drain(self, now: float) -> None:
        self.scaler.frozen = True  # an evaluation answered later must not raise a target
        self.dispatcher.release_unstarted()
        for pool in self.pools.values():
            pool.target = 0

    def advance_drain(self, now: float) -> None:
        if not self.drain.active:
            return
        workers = [w for p in self.pools.values() for w in p.workers.values()]
        for worker in workers:  # at the start, and each busy one as its job ends
            if (
                worker.state in (WorkerState.IDLE, WorkerState.STARTING)
                and worker.kill_reason is None
            ):
                worker.kill(KillReason(KillKind.DRAIN, "idle worker stopped by the drain"), now)
        busy = [w for w in workers if w.job is not None]
        before = self.drain.phase
        pending = self.dispatcher.pending_writes + len(self.dispatcher.claiming)
        phase = self.drain.tick(now, len(busy), len(workers), pending)
        if phase == DrainPhase.KILLING:
            for worker in workers:
                if worker.kill_reason is None:
                    worker.kill(KillReason(KillKind.DRAIN, "drain: grace period over"), now)
        if phase == DrainPhase.STOPPED and self.dispatcher.pending_writes:
            log.error(
                "database unreachable: %d result(s) not written; their leases will "
                "expire and the jobs be retried",
                self.dispatcher.pending_writes,
            )
        if phase != before:
            log.warning("drain: %s", phase)

    def stop_after_error(self) -> None:
        """After an unexpected error: SIGKILL every worker, wait for them, then write what
        is finished and release every other lease held (attempts given back), retrying for
        ``WRITE_PATIENCE``. What still cannot be written expires into a reaper."""
        d = self.dispatcher
        d.draining = True  # a claim answered from here on is released at once
        d.disarm()
        workers = [w for p in self.pools.values() for w in p.workers.values()]
        for worker in workers:
            worker.kill(
                KillReason(KillKind.DRAIN, "the supervisor's loop failed"), self.clock.monotonic()
            )
        deadline = self.clock.monotonic() + 5.0
        for worker in workers:
            _wait_dead(worker.pid, deadline)
        for lease in d.held_leases():
            d.outbox.release(lease)
        d.forget_held()
        give_up = self.clock.monotonic() + WRITE_PATIENCE
        while (d.pending_writes or d.claiming) and self.clock.monotonic() < give_up:
            try:
                self.reap_links()
                self.tick_links(self.clock.monotonic())
                d.flush(self.clock.monotonic(), force=True)
                self.link.wait_idle(max(0.0, give_up - self.clock.monotonic()))
            except Exception:
                log.exception("could not write results after the loop failed")
                break
            if d.pending_writes:
                time.sleep(max(0.0, min(d.store_retry_at - self.clock.monotonic(), 0.2)))
        if d.pending_writes:
            log.error(
                "%d result(s) and release(s) not written; their leases will expire and the "
                "jobs run again",
                d.pending_writes,
            )
        self.shutdown()

    def reap_links(self) -> None:
        """Reap store processes that exited (outside the loop, which reaps every child)."""
        for process in self.processes:
            if process.pid is None:
                continue
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(process.pid, os.WNOHANG)
                if done:
                    process.exited(status, self.clock.monotonic())

    def shutdown(self) -> None:
        """Mark the node row stopped (unless the store sits on a call: the row then goes stale
        and views call the node gone), end the store process, close what the loop holds."""

        def marked(reply: Reply) -> None:
            if reply.error is not None:
                log.warning("could not mark node stopped: %s", reply.error)

        self.reap_links()
        chores = self.chores
        if isinstance(chores, ProcessLink) and chores.pid is None:
            chores.start(self.child_cleanup)  # it died: one more, for the node's last row
        if chores.pending():
            log.warning("node row not marked stopped: the store is not answering")
        else:
            try:
                chores.submit(NodeHeartbeat(self.node_id, "stopped", None), on_reply=marked)
                if not chores.wait_idle(1.0):
                    log.warning("node row not marked stopped: the store did not answer in 1s")
            except StoreBug:  # ``marked`` said it; the loop is over: its guard is gone
                pass
        if self.forker is not None:
            self.forker.close(1.0)  # it kills a worker still there (none after a drain)
        for process in self.processes:
            process.close(0.5)
        if self.waker is not None:
            self.waker.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.loop is not None:
            self.loop.close()
        self.memcg.close()
        if self.scratch_root is not None:
            scratch.remove(self.scratch_root)
        log.info("fleetd supervisor %s stopped: %s", self.node_id, self.summary())

    def summary(self) -> str:
        c = self.counters
        done = sum(v for (_, outcome), v in c.finished.items() if outcome == "done")
        return (
            f"{done} done, {sum(c.dead_letters.values())} dead-lettered, "
            f"{c.releases} released, {c.lease_expiries} expired leases reaped"
        )

    # ---- wake-ups and the node row -----------------------------------------------------

    def connect_waker(self, now: float) -> None:
        assert self.loop is not None
        try:
            self.waker = self.store.waker()
        except Exception as exc:
            log.warning("wake-up channel unavailable (%s); polling only", exc)
            self.waker, self.next_waker_at = None, now + 5.0
            return
        if self.waker is not None:
            self.loop.watch(self.waker.fileno(), self.on_wake)

    def on_wake(self) -> None:
        assert self.loop is not None
        self.on_wake_pools(self.waker.drain())
        if self.waker.broken:
            self.loop.unwatch(self.waker.fileno())
            self.waker.close()
            self.waker = None
            self.next_waker_at = self.clock.monotonic() + 1.0

    def on_wake_pools(self, pools: set[str]) -> None:
        if CONTROLS_WAKE in pools:
            self.controls.wake()
        for name in pools:
            if name in self.pools:
                self.dispatcher.wake(self.pools[name])
                self.woken_pools.add(name)

    def claim_woken(self, now: float) -> None:
        """Claim for the pools a wake-up named, early in the pass: once this pass's signals,
        frames and exits are read (so the claim is sized on them and a SIGTERM comes first),
        before the watchdog and the rest. Claimed from the wake-up's callback instead, a
        claim could go out sized before the same batch's JobDone frames were read."""
        woken, self.woken_pools = self.woken_pools, set()
        if self.drain.active:
            return
        for name in woken:
            self.dispatcher.claim(self.pools[name], now)

    def publish(self, now: float) -> None:
        if self.waker is None and self.loop_wakes and now >= self.next_waker_at:
            self.connect_waker(now)
        self.pinger.tick(self.pools.values(), now)
        if self.metrics is not None:
            self.metrics.expire(now)
        if now < self.next_publish:
            return
        self.next_publish = now + PUBLISH_EVERY
        if now >= self.dispatcher.store_retry_at:  # not while backing off from a failure
            self.observer.request(self.chores, now)
        snapshot = self.snapshot_json()  # every tick: /healthz and /metrics serve it
        if self.heartbeat_in_flight:
            return  # the last one is not answered yet (a stalled store): the next will say it
        self.heartbeat_in_flight = True
        state = "draining" if self.drain.active else "running"
        self.chores.submit(
            NodeHeartbeat(self.node_id, state, snapshot), on_reply=self.heartbeat_written
        )

    def heartbeat_written(self, reply: Reply) -> None:
        self.heartbeat_in_flight = False
        if reply.error is not None:
            log.debug("node heartbeat failed: %s", reply.error)

    def snapshot_json(self) -> str:
        """This instant's FleetSnapshot as JSON (the node row; also kept for /metrics)."""
        return self.observer.build(
            self.clock.monotonic(),
            pools=self.pools,
            counters=self.counters,
            draining=self.drain.active,
            dispatcher=self.dispatcher,
            pinger=self.pinger,
            store_waiting_since=self.store_waiting_since(),
            scaling=self.scaler.scaling,
            schedules=self.scheduler.views(self.clock.monotonic()),
        ).to_json()

    def listen_metrics(self) -> None:
        """Bind ``fleet.metrics`` (served by the loop once it exists)."""
        address = self.config.metrics_address
        if address is None:
            return
        try:
            self.metrics = MetricsServer.bind(
                address,
                lambda: self.observer.current(self.clock.monotonic()),
                self.clock.monotonic,
            )
        except OSError as exc:
            raise FleetdError(f"metrics: cannot listen on {self.config.metrics}: {exc}") from exc
        log.info("metrics and health on http://%s/metrics and /healthz", self.config.metrics)

    def set_title(self) -> None:
        workers = sum(len(p.workers) for p in self.pools.values())
        setproctitle(
            f"fleetd: supervisor [{self.config.name}] {len(self.pools)} pools {workers} workers"
        )


_LOOP_FAULT = os.environ.get("FLEETD_TEST_LOOP_FAULT")  # read once, at import


def _injected_fault(dispatcher: Dispatcher) -> None:
    """Test seam: raise once this node holds ``FLEETD_TEST_LOOP_FAULT`` leases in workers
    (the error policy's test; unset in production, where this is one comparison a pass)."""
    at = _LOOP_FAULT
    if at and sum(1 for _ in dispatcher.running_leases()) >= int(at):
        raise RuntimeError(f"injected loop fault (FLEETD_TEST_LOOP_FAULT={at})")


def _wait_dead(pid: int, deadline: float) -> None:
    """Wait until ``pid`` is dead (reaped here if it is our child, else gone or a zombie of
    the forker's) or ``deadline`` (monotonic) passed."""
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)


def _is_child(pid: int) -> bool:
    """``pid`` is this process's child (alive, or a zombie not reaped yet)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True
