"""``JobOutcomes``: what the workers say and how they end, turned into the store's writes.

    JobDone ──> ack (Outbox) ······ JobFailed, an unstorable result ──> fail (retry or dead)
    Returned (unstarted, drain) ──> release ······ exit ──> job_verdicts ──> fail / release
    / cancel, per job it held (run/exits.py)

Every write goes to the ``Outbox`` (run/outbox.py), which batches them; every finished job is
counted once and a non-success logged once. A failure carries its retry delay
(``policy.retry_delay``, jitter from ``rng``) and the pool's retry budget. Owned by the
supervisor's main thread, beside the ``Dispatcher`` that hands jobs out.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from supervisor.clock import Clock
from supervisor.model import ErrorKind, Failure, RetryBudget
from supervisor.policy import retry_delay
from supervisor.run.counters import Counters
from supervisor.run.exits import ExitVerdict, job_verdicts
from supervisor.run.outbox import Outbox, log_job
from supervisor.run.pool import Pool
from supervisor.run.workerproc import InFlight, WorkerHandle, WorkerState
from supervisor.storable import UnstorableResult, storable_message, storable_result
from supervisor.units import format_duration
from workers import exitcodes, protocol

log = logging.getLogger("fleetd.dispatch")

JOB_RESULTS = (protocol.JobDone, protocol.JobFailed)


class JobOutcomes:
    def __init__(
        self,
        pools: dict[str, Pool],
        outbox: Outbox,
        clock: Clock,
        counters: Counters,
        rng: random.Random,
        on_ready: Callable[[Pool, float], None],
    ) -> None:
        self.pools = pools
        self.outbox = outbox
        self.clock = clock
        self.counters = counters
        self.rng = rng
        self.on_ready = on_ready  # a worker finished booting: hand it what is buffered

    def on_message(self, worker: WorkerHandle, msg: protocol.Message, now: float) -> None:
        """One frame from ``worker``: Ready, a result, a job handed back, Pong, Recycling."""
        pool = self.pools[worker.pool]
        job = worker.running.get(msg.job_id) if isinstance(msg, JOB_RESULTS) else None
        if isinstance(msg, protocol.Ready) and worker.state == WorkerState.STARTING:
            worker.state = WorkerState.IDLE
            pool.boot_failures = 0
            self.on_ready(pool, now)  # claimed while it booted: a fresh worker per job
            # waits for no pass
        elif isinstance(msg, protocol.JobDone) and job:
            try:
                result = storable_result(msg.result)
            except UnstorableResult as exc:
                self.fail(pool, job, ErrorKind.PERMANENT, str(exc), msg.peak_rss, msg.duration)
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
            self.fail(pool, job, kind, message, msg.peak_rss, msg.duration)
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
            self.fail(pool, job, verdict.error_kind, verdict.message, peak, took)
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

    def fail(
        self,
        pool: Pool,
        job: InFlight,
        kind: ErrorKind,
        message: str,
        peak: int | None,
        duration: float | None,
    ) -> None:
        """``job`` failed with ``kind``: retried after its backoff, or dead if permanent."""
        c = pool.config
        delay = (
            None
            if kind is ErrorKind.PERMANENT
            else retry_delay(job.claimed.attempt, c.retry_backoff, c.retry_backoff_max, self.rng)
        )
        budget = retry_budget(c.retry_budget)
        failure = Failure(job.claimed.lease, kind, message, delay, peak, duration, budget)
        self.outbox.fail(pool.name, failure, job.claimed)
        self.counters.job_finished(pool.name, str(kind), duration, peak, self.clock.monotonic())
        log_job(
            logging.INFO, "job_failed", job.claimed, pool.name, duration, peak, str(kind), message
        )


def retry_budget(ratio: float | None) -> RetryBudget | None:
    """The pool's retry budget (``retry_budget``; floor and window at their defaults)."""
    return None if ratio is None else RetryBudget(ratio)
