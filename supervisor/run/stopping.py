"""How a fleet stops: the drain a signal starts (``begin_drain``, ``advance_drain``, on
``run/drain.py``'s phases), the emergency stop after an unexpected error in the loop
(``stop_after_error``), and the shutdown both end in (``shutdown``).

What each leaves: a drain hands back the jobs claimed but not started, lets busy workers finish
within the grace period, then kills them (their jobs released); results are written or, if
the database stays away, left to expire into a reaper. The emergency stop kills every worker
at once and releases every lease. The shutdown marks the node row stopped and closes what the
boot opened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import psutil

from supervisor.policy import KillKind, KillReason
from supervisor.run.drain import DrainPhase
from supervisor.run.link import Reply, StoreBug
from supervisor.run.parts import Parts
from supervisor.run.requests import NodeHeartbeat
from supervisor.run.storelink import ProcessLink
from supervisor.run.workerproc import WorkerState
from workers import scratch

log = logging.getLogger("fleetd.supervisor")

WRITE_PATIENCE = 10.0  # seconds an emergency stop keeps trying to write what it holds
# seconds the shutdown gives the store processes, all of them together, to exit on EOF before
# SIGKILL: one sitting on a call in a stall reads no EOF, and two waits of their own made a
# drain in a stall end past grace + 12 s
CLOSE_WITHIN = 0.5


def begin_drain(p: Parts, now: float) -> None:
    p.scaler.frozen = True  # an evaluation answered later must not raise a target
    p.dispatcher.release_unstarted()
    for pool in p.pools.values():
        pool.target = 0


def advance_drain(p: Parts, now: float) -> None:
    if not p.drain.active:
        return
    workers = p.workers()
    for worker in workers:  # at the start, and each busy one as its job ends
        if worker.state in (WorkerState.IDLE, WorkerState.STARTING) and worker.kill_reason is None:
            worker.kill(KillReason(KillKind.DRAIN, "idle worker stopped by the drain"), now)
    busy = [w for w in workers if w.job is not None]
    before = p.drain.phase
    pending = p.dispatcher.pending_writes + len(p.dispatcher.claiming)
    phase = p.drain.tick(now, len(busy), len(workers), pending)
    if phase == DrainPhase.KILLING:
        for worker in workers:
            if worker.kill_reason is None:
                worker.kill(KillReason(KillKind.DRAIN, "drain: grace period over"), now)
    if phase == DrainPhase.STOPPED and p.dispatcher.pending_writes:
        log.error(
            "database unreachable: %d result(s) not written; their leases will "
            "expire and the jobs be retried",
            p.dispatcher.pending_writes,
        )
    if phase != before:
        # a drain that ends as it should is news, not a warning: a kill phase or lost
        # writes are
        calm = phase == DrainPhase.STOPPED and before == DrainPhase.FINISHING
        level = logging.INFO if calm and not p.dispatcher.pending_writes else logging.WARNING
        log.log(level, "drain: %s", phase)


def stop_after_error(p: Parts) -> None:
    """After an unexpected error: SIGKILL every worker, wait for them, then write what
    is finished and release every other lease held (attempts given back), retrying for
    ``WRITE_PATIENCE``. What still cannot be written expires into a reaper."""
    d = p.dispatcher
    d.draining = True  # a claim answered from here on is released at once
    d.disarm()
    workers = p.workers()
    for worker in workers:
        worker.kill(KillReason(KillKind.DRAIN, "the supervisor's loop failed"), p.clock.monotonic())
    deadline = p.clock.monotonic() + 5.0
    for worker in workers:
        _wait_dead(worker.pid, deadline)
    for lease in d.held_leases():
        d.outbox.release(lease)
    d.forget_held()
    give_up = p.clock.monotonic() + WRITE_PATIENCE
    bug_seen = False
    while (d.pending_writes or d.claiming) and p.clock.monotonic() < give_up:
        try:
            p.processes.reap(p.clock.monotonic())
            p.processes.tick(p.clock.monotonic(), p.child_cleanup)
            d.flush(p.clock.monotonic(), force=True)
            p.link.wait_idle(max(0.0, give_up - p.clock.monotonic()))
        except StoreBug as bug:
            # a store call failed by a bug (this write, or another call's reply read with
            # it): its callback put back what it held; the releases are written again
            if not bug_seen:
                log.error("a store call failed during the emergency stop: %s", bug)
            bug_seen = True
        except Exception:
            log.exception("could not write results after the loop failed")
            break
        if d.pending_writes:  # a backoff's end, or a store process forked again: not a spin
            time.sleep(max(0.01, min(d.store_retry_at - p.clock.monotonic(), 0.2)))
    if d.pending_writes:
        log.error(
            "%d result(s) and release(s) not written; their leases will expire and the "
            "jobs run again",
            d.pending_writes,
        )
    shutdown(p)


def shutdown(p: Parts) -> None:
    """Mark the node row stopped (unless the store sits on a call: the row then goes stale
    and views call the node gone), end the store process, close what the loop holds."""

    def marked(reply: Reply) -> None:
        if reply.error is not None:
            log.warning("could not mark node stopped: %s", reply.error)

    with contextlib.suppress(StoreBug):  # a reply left by a dead store process: logged there
        p.processes.reap(p.clock.monotonic())
    chores = p.chores
    if isinstance(chores, ProcessLink) and chores.pid is None:
        chores.start(p.child_cleanup)  # it died: one more, for the node's last row
    if chores.pending():
        log.warning("node row not marked stopped: the store is not answering")
    else:
        try:
            chores.submit(NodeHeartbeat(p.node_id, "stopped", None), on_reply=marked)
            if not chores.wait_idle(1.0):
                log.warning("node row not marked stopped: the store did not answer in 1s")
        except StoreBug:  # ``marked`` said it; the loop is over: its guard is gone
            pass
    if p.forker is not None:
        p.forker.close(1.0)  # it kills a worker still there (none after a drain)
    closed_by = time.monotonic() + CLOSE_WITHIN
    for process in p.processes:
        process.close(max(0.0, closed_by - time.monotonic()))
    if p.waker is not None:
        p.waker.close()
    if p.metrics is not None:
        p.metrics.close()
    if p.loop is not None:
        p.loop.close()
    p.memcg.close()
    if p.scratch_root is not None:
        scratch.remove(p.scratch_root)
    log.info("fleetd supervisor %s stopped: %s", p.node_id, summary(p))


def summary(p: Parts) -> str:
    c = p.counters
    done = sum(v for (_, outcome), v in c.finished.items() if outcome == "done")
    return (
        f"{done} done, {sum(c.dead_letters.values())} dead-lettered, "
        f"{c.releases} released, {c.lease_expiries} expired leases reaped"
    )


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
