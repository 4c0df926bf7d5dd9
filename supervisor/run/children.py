"""``Children``: the supervisor's children and their ends. The forker (workers/forker.py, asked
through ``run/forklink.py``) forks every worker; this starts it, starts another when it dies,
asks it for workers up to each pool's target, reads the workers' frames, and reaps: the exits
the forker relays, and the supervisor's own children (the store processes, the forker, what a
dead worker's job left, and after a forker's death its workers).

A worker's end: its last frames are read, its cgroup judged (a kernel OOM kill becomes
memory_limit), its jobs judged (``run/exits.py``, through the dispatcher), its job folders
removed, and its pool told (which may fork a replacement). Owned by the main thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import tempfile

from supervisor.imports import handler_refs
from supervisor.policy import KillKind, KillReason, backoff_cap
from supervisor.run.exits import exit_code, waitid_exit_code
from supervisor.run.forklink import BOOT_LIMIT, ForkerGone, ForkFailed, start_forker
from supervisor.run.parts import Parts
from supervisor.run.pool import Pool
from supervisor.run.workerproc import WorkerHandle, WorkerState
from workers import protocol, scratch, tree
from workers.forker import ended_abnormally

log = logging.getLogger("fleetd.supervisor")

FORKER_PAUSE = 1.0  # seconds between the start of a forker and that of the next
# ... doubled for each forker in a row that stopped before it was ready (its imports fail:
# each try imports every handler again), up to this
FORKER_PAUSE_AT_MOST = 60.0


class Children:
    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.forker_due = 0.0  # when a forker that died may be started again
        self.forkers_broken = 0  # forkers in a row that stopped before they were ready
        self.handler_refs = handler_refs(parts.config)  # the names each forker imports them by
        # seconds a forker may take to import the handlers (the first one's, from boot)
        forker = parts.forker
        self.forker_boot_limit = forker.boot_limit if forker is not None else BOOT_LIMIT

    def due_at(self, now: float) -> float | None:
        """When the loop must act for its children: relayed exits read already (reap them
        now), a pool below its target whose next spawn (and forker) is due."""
        forker = self.parts.forker
        due = [now] if forker is not None and forker.exits else []
        forker_at: float | None = None
        for pool in self.parts.pools.values():
            if pool.live() < pool.wanted():
                if forker_at is None:
                    forker_at = self.forker_due_at()
                due.append(max(pool.next_spawn_at, forker_at))
        return min(due, default=None)

    # ---- workers -----------------------------------------------------------------------

    def spawn(self, now: float) -> None:
        """Fork up to each pool's target, a small random stagger apart (forty cold starts at
        once are a load spike of their own), except a replacement for a worker that retired
        after its job (max_jobs_per_worker, recycle_rss): forked at once, since a pool that
        recycles after every job would otherwise wait for the stagger on every job. Retire
        idle workers above the target."""
        p = self.parts
        if p.drain.active:
            return
        for pool in p.pools.values():
            if pool.spawn_due(now) and self.forker_ready(now):
                replacing = pool.take_replacement()  # for a worker that retired: no stagger
                if not self.fork(pool, now):
                    continue
                if not replacing:
                    pool.next_spawn_at = max(pool.next_spawn_at, now + p.rng.uniform(0, 0.05))
                else:  # claim its job while it boots: it gets it the moment it is Ready
                    p.dispatcher.claim(pool, now)
            for worker in pool.idle()[: max(0, pool.live() - pool.wanted())]:
                worker.kill(KillReason(KillKind.RETIRE, "scaled in"), now)

    def fork(self, pool: Pool, now: float) -> bool:
        """Have the forker fork one worker of ``pool``; whether it did."""
        p = self.parts
        assert p.loop is not None and p.forker is not None
        spec = pool.spec()
        # the worker joins its cgroup itself, before Ready (so before any job is sent)
        prepared = p.memcg.prepare(spec.pool, spec.slot, pool.config.memory_limit)
        try:
            worker = p.forker.fork_worker(
                spec, now=now, cgroup_fd=prepared.fd if prepared is not None else None
            )
        except (ForkFailed, ForkerGone) as exc:
            if prepared is not None:
                p.memcg.abandon(prepared)
            if isinstance(exc, ForkerGone):
                self.forker_gone(now, str(exc))
            else:  # a failed fork (EAGAIN, ENOMEM) counts as a worker that died at boot
                log.warning("pool %s: could not fork a worker: %s", pool.name, exc)
                pool.boot_failed(now)
            return False
        p.memcg.adopt(worker, prepared)
        if p.hooks.no_kill:
            worker.unkillable = p.hooks.no_kill
        pool.workers[worker.pid] = worker
        p.loop.watch(worker.fd, lambda w=worker: self.read_worker(w))
        p.set_title()
        return True

    def read_worker(self, worker: WorkerHandle, now: float | None = None) -> None:
        """Handle every frame the worker has written so far, in order (a result makes the next
        job of a pipeline current)."""
        p = self.parts
        assert p.loop is not None
        messages, eof, broken = worker.reader.drain(worker.fd)
        if broken is not None:  # the frames before it are handled below; then it is at EOF
            # a reset from a worker this supervisor stopped is expected; from any other it
            # comes with an exit the classifier reports, so this line only adds the detail
            stopped = worker.kill_reason is not None or worker.state == WorkerState.STOPPING
            level = logging.DEBUG if stopped else logging.WARNING
            log.log(level, "worker %s: broken frame: %s", worker.name, broken)
        now = p.clock.monotonic() if now is None else now
        p.pinger.on_messages(worker, messages, now)
        for msg in messages:
            # in a worker with slots the kill is about the job that failed, not the oldest
            about = msg.job_id if isinstance(msg, protocol.JobFailed) and worker.slots > 1 else None
            if isinstance(msg, protocol.JobFailed) and p.memcg.failed_by_oom(worker, now, about):
                # a process of its job was OOM-killed: the worker is stopped, and the failure
                # is that kill's (the frames after it are still results of later jobs)
                detail = worker.kill_reason.detail if worker.kill_reason else msg.message
                msg = dataclasses.replace(msg, error_kind=protocol.MEMORY_LIMIT, message=detail)
            p.dispatcher.on_message(worker, msg, now)
        if eof:  # the worker is exiting; SIGCHLD brings its status
            p.loop.unwatch(worker.fd)

    def make_scratch_root(self) -> None:
        """The directory of the workers' job folders (workers.scratch); those of supervisors
        that are gone are removed. Without it, jobs use the temp directory itself."""
        p = self.parts
        try:
            root, removed = scratch.make_root(tempfile.gettempdir(), p.pid)
        except OSError as exc:
            log.warning("no directory for job folders (%s): a killed job's folder stays", exc)
            return
        for path in removed:
            log.info("removed %s, left by a supervisor that is gone", path)
        p.scratch_root = root
        for pool in p.pools.values():
            pool.scratch_root = root

    # ---- the forker --------------------------------------------------------------------

    def start_forker(self) -> None:
        """At boot, when ``fleetd start`` did not start one before its imports."""
        if self.parts.forker is None:
            self.parts.forker = start_forker(self.parts.handlers, self.handler_refs)

    def watch_forker(self) -> None:
        p = self.parts
        assert p.loop is not None and p.forker is not None
        fd = p.forker.fileno()
        if fd is not None:
            p.loop.watch(fd, self.on_forker)

    def forker_ready(self, now: float) -> bool:
        """A forker to ask: the one running once it has imported the handlers, or a new one
        once a dead one's pause is over (asked from the next pass on, when it is ready)."""
        p = self.parts
        if p.forker is not None:
            limit = p.forker.boot_limit
            if not p.forker.ready and now >= p.forker.started_at + limit:
                self.forker_gone(now, f"it did not import the handlers in {limit:g}s")
                return False
            return p.forker.ready
        if now < self.forker_due:
            return False
        try:
            p.forker = start_forker(
                p.handlers, self.handler_refs, boot_limit=self.forker_boot_limit
            )
        except (OSError, ValueError) as exc:  # EAGAIN, ENOMEM, EMFILE: no fork until the next try
            self.forker_due = now + FORKER_PAUSE
            log.error("could not start a forker (%s); next try in %gs", exc, FORKER_PAUSE)
            return False
        p.forker.started_at = now  # its boot limit and pause run on the loop's clock
        self.watch_forker()
        log.info("forker started again (pid %d)", p.forker.pid)
        return False

    def forker_due_at(self) -> float:
        """When a fork can next be asked for: a new forker's start, or the bound on a booting
        one's imports (its ``ready`` wakes the loop through its socket before that)."""
        forker = self.parts.forker
        if forker is None:
            return self.forker_due
        if not forker.ready:
            return forker.started_at + forker.boot_limit
        return 0.0

    def on_forker(self) -> None:
        """Workers that ended, as the forker relays them; its end closed: it is gone."""
        p = self.parts
        forker = p.forker
        assert forker is not None and p.loop is not None
        fd = forker.fileno()
        now = p.clock.monotonic()
        for pid, status in forker.take_exits():
            self.worker_reaped(pid, status, now)
            forker.reaped(pid)  # forgotten here: from now on its pid may name another process
        if forker.gone:
            if fd is not None:
                p.loop.unwatch(fd)
            self.forker_gone(now, forker.broken or "it closed its end")

    def forker_gone(self, now: float, why: str) -> None:
        """The forker died or broke: its workers die with it (PR_SET_PDEATHSIG), come to us
        (a subreaper) and are reaped here; their jobs are released untouched. The exits it
        relayed before it died are read first and keep their status (a crash stays a
        crash); one whose exit it took with it is forgotten as killed. Another forker is
        started, at most once a second."""
        p = self.parts
        forker, p.forker = p.forker, None
        assert forker is not None
        if forker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(forker.pid, signal.SIGKILL)
        if p.loop is not None and (fd := forker.fileno()) is not None:
            p.loop.unwatch(fd)
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
        for pool in p.pools.values():
            for worker in list(pool.workers.values()):
                worker.record_kill(KillReason(KillKind.RETIRE, "the forker stopped"), now)
                if not _is_child(worker.pid):  # reaped by the forker, exit not relayed
                    self.worker_reaped(worker.pid, signal.SIGKILL, now)

    # ---- reaping -----------------------------------------------------------------------

    def reap_children(self, now: float) -> None:
        """Workers the forker reaped (relayed while the loop waited for a fork's answer, so
        no readable socket calls ``on_forker`` for them); then our own children: the store
        processes, the forker, what a dead worker's job left (``end_strays``) and, after the
        forker died, its workers."""
        p = self.parts
        if p.forker is not None and p.forker.exits:
            self.on_forker()
        while True:
            try:  # look first (WNOWAIT): the zombie keeps its process group's id reserved
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            if ended_abnormally(waitid_exit_code(info)) and any(
                info.si_pid in pool.workers for pool in p.pools.values()
            ):
                # as the forker does (workers/forker.py): the job's processes die with it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(info.si_pid, signal.SIGKILL)
            pid, status = os.waitpid(info.si_pid, 0)
            process = p.processes.owner_of(pid)
            if process is not None:
                process.exited(status, now)
            elif p.forker is not None and pid == p.forker.pid:
                p.forker.pid = None
                self.forker_gone(now, f"it exited, wait status {status}")
            else:
                self.worker_reaped(pid, status, now)

    def worker_reaped(self, pid: int, status: int, now: float) -> None:
        """A worker ended (the forker relayed it, or it was our child): its job's strays
        are killed if it died abnormally, then its pool hears of it."""
        for pool in self.parts.pools.values():
            worker = pool.workers.get(pid)
            if worker is not None:
                if ended_abnormally(exit_code(status)):
                    self.end_strays()
                self.worker_exited(pool, worker, status, now)
                return

    def end_strays(self) -> None:
        """Kill what a dead worker's job left that escaped its process group (a daemon that
        called setsid): the supervisor is a subreaper, so it was re-parented to us. Any child
        that is neither a worker nor a store process is such a stray."""
        p = self.parts
        known = {pid for pool in p.pools.values() for pid in pool.workers}
        known.update(p.processes.pids())
        if p.forker is not None and p.forker.pid is not None:
            known.add(p.forker.pid)
        for pid in tree.children(p.pid):
            if pid not in known:
                tree.end_all(root=pid)
                tree.signal_all([pid], signal.SIGKILL)

    def worker_exited(self, pool: Pool, worker: WorkerHandle, status: int, now: float) -> None:
        p = self.parts
        assert p.loop is not None
        booted = worker.state != WorkerState.STARTING
        self.read_worker(worker, now)  # its last frames (results may precede its death)
        p.loop.unwatch(worker.fd)
        worker.sock.close()
        if worker.cancel_slot is not None:
            worker.cancel_slot.close()
            worker.cancel_slot = None
        p.memcg.worker_exited(worker, status, now)  # a kernel OOM kill becomes memory_limit
        if worker.kill_reason is not None:
            p.counters.worker_kills[(pool.name, worker.kill_reason.kind)] += 1
        elif not booted:
            p.counters.worker_boot_failures += 1
        p.dispatcher.on_exit(worker, status, now)
        p.pinger.forget(worker.pid)
        if pool.scratch_root is not None and pool.runs_commands:
            # its job folders, even one of a job it was killed in (local disk: quick); only
            # command jobs make them (with max_jobs_per_worker = 1 an rmtree every worker
            # was a fifth of the loop's samples, py-spy)
            scratch.remove(
                scratch.worker_dir(pool.scratch_root, pool.name, worker.slot, worker.pid)
            )
        pool.worker_gone(worker, booted, now)
        p.set_title()


def _is_child(pid: int) -> bool:
    """``pid`` is this process's child (alive, or a zombie not reaped yet)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True
