"""The worker's job loop, one job at a time in its main thread (``Worker``; a worker with
slots extends it: workers/slots.py)::

    RunJob ─> reset VmHWM ─> handler(payload) in this thread (a command handler:
                  │          its program, workers.command)
                  ├─> every process the job left is killed (workers.tree)
                  └─> JobDone(result) | JobFailed(exception|permanent|memory_limit)
                      └─> recycle? ─> Recycling ─> exit RECYCLE
    Ping ─> Pong(rss)        Shutdown ─> exit OK
    Release ─> Returned(job_id) for every RunJob received and not started (workers.conn)

Before acting on a waiting frame the worker reads, without blocking, whatever else has
arrived, so a Release sent behind queued jobs is seen before the next of them starts.

The worker never enforces deadlines or memory_limit itself: the parent kills it (SIGKILL) for
a timeout, a lease it lost, an RSS over the limit or a drain. The handler runs in the main
thread, so the worker reads no frame while a job runs; a frame the parent sends meanwhile
waits in the socket.
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import replace
from typing import Any, NoReturn

from workers import context, exitcodes, limits, proctitle, protocol, startup, tree
from workers.command import CommandHandler
from workers.conn import Connection
from workers.errors import one_line
from workers.exiting import WorkerExit, flush_stdio
from workers.outcome import MAX_TEXT, Outcome, call
from workers.signals import soft_timeout_window
from workers.spec import MIB, NEAR_LIMIT, ROOM_TO_GROW, WorkerSpec

ALARM_SLACK = 0.5  # seconds the deadline alarm may fire after the backstop (arm_between)
SHM_FULL = "filled its private /dev/shm"


class Worker(Connection):
    """The worker's state: its connection, spec, memory cap and job count. One thread."""

    def __init__(self, conn_fd: int, spec: WorkerSpec) -> None:
        super().__init__(conn_fd, spec.max_frame)
        self.spec = spec
        self.cap: limits.MemoryCap | None = None
        self.jobs_done = 0
        self.busy_title = False  # the title names a job
        self.alarm: limits.DeadlineAlarm | None = None  # disarmed before waiting for work
        self.rss_cap: int | None = spec.recycle_rss  # lowered after the first job
        self.pid = os.getpid()
        self.subreaper = False  # PR_SET_CHILD_SUBREAPER took
        self.own_shm = False  # /dev/shm is this worker's own (emptied after every job)
        self.shm_fresh: tree.ShmBaseline | None = None  # what it counts empty, which it is

    def setup(self) -> None:
        """Everything between the fork and ``Ready`` (``workers.startup``); failures exit
        SETUP_FAILED."""
        started = startup.start(self.fd, self.spec, self.rlimit_headroom)
        self.cap = started.cap
        self.alarm = started.alarm
        self.subreaper = started.subreaper
        self.own_shm = started.own_shm
        self.shm_fresh = started.shm_fresh
        proctitle.set_title(proctitle.title_idle(self.spec.pool, self.spec.slot))
        self.send(protocol.Ready(os.getpid()))

    def rlimit_headroom(self) -> int:
        """Bytes the memory rlimit allows above ``memory_limit`` (a worker with slots adds
        its threads' stacks: workers/slots.py)."""
        return self.spec.rlimit_headroom

    # --- the loop ---

    def serve(self) -> NoReturn:
        """Answer frames until Shutdown, EOF or a recycle."""
        while True:
            msg = self._read()
            if isinstance(msg, protocol.RunJob):
                self.send_bytes(self._run(msg))
                self._after_job()
            elif isinstance(msg, protocol.Ping):
                self.send(protocol.Pong(msg.seq, limits.current_rss()))
            elif isinstance(msg, protocol.Shutdown):
                raise WorkerExit(exitcodes.OK)
            else:
                why = f"unexpected {type(msg).__name__} frame from the parent"
                raise WorkerExit(exitcodes.PROTOCOL_ERROR, why)

    def _read(self) -> protocol.Message:
        """The next message to act on. Blocks only when none is waiting; otherwise first
        takes in, without blocking, what else has arrived (a Release, say)."""
        if self.inbox and self.poller.poll(0):
            self.receive()
        while not self.inbox:
            self._idle_title()  # a Release may have taken back the jobs that were queued
            self.receive()
        return self.inbox.popleft()

    def _idle_title(self) -> None:
        """Say idle, unless the title already does (it is not rewritten between jobs); and
        disarm the deadline alarm (no job runs)."""
        if self.alarm is not None and self.alarm.fires_at is not None:
            self.alarm.arm(0)
        if self.busy_title:
            proctitle.set_title(proctitle.title_idle(self.spec.pool, self.spec.slot))
            self.busy_title = False

    # --- one job ---

    def _run(self, job: protocol.RunJob) -> bytes:
        """Run one job; the encoded JobDone or JobFailed frame to send."""
        spec = self.spec
        handler = spec.handlers.get(job.kind)
        if handler is None:
            why = f"no handler for kind {job.kind!r} in pool {spec.pool!r}"
            return self.failed(job, Outcome(error_kind=protocol.EXCEPTION, message=why))
        try:
            payload = json.loads(job.payload)
        except ValueError as exc:  # the client checks payloads, so retrying cannot help
            why = f"payload is not valid JSON: {exc}"
            return self.failed(job, Outcome(error_kind=protocol.PERMANENT, message=why))
        if self.jobs_done == 0:
            limits.peak_since_start()
        else:
            limits.reset_peak_rss()
        if self.alarm is not None and spec.hard_deadline is not None:
            # the kernel's backstop: a job past this dies with its worker even if the parent
            # cannot kill it (stopped, descheduled, a bug). Up to ALARM_SLACK late, so that
            # short jobs re-arm it once every ALARM_SLACK seconds, not one system call a job
            self.alarm.arm_between(spec.hard_deadline, ALARM_SLACK)
        proctitle.set_title(proctitle.title_busy(spec.pool, spec.slot, job.job_id, job.kind, 0))
        self.busy_title = True
        token = context.bind(
            context.JobContext(job.job_id, job.kind, job.attempt, job.deadline, spec.pool)
        )
        try:
            if isinstance(handler, CommandHandler):
                outcome = _run_command(handler, payload)  # its own deadline and kill ladder
            else:
                outcome = call(soft_timeout_window(handler), payload)
        finally:
            if os.getpid() != self.pid:
                # A handler forked and its child returned here: two processes must never
                # share the parent's connection. The copy leaves without a word.
                os._exit(exitcodes.INTERNAL_ERROR)
            context.unbind(token)
            if spec.end_job_tree:
                tree.end_all()  # nothing the job started outlives it (workers.tree)
            # nor what it left in /dev/shm; a job that filled it was short of memory
            shm_full = self.own_shm and tree.shm_after_job(self.shm_fresh)
            if not (self.inbox and isinstance(self.inbox[0], protocol.RunJob)):
                self._idle_title()  # before the result goes out: nothing queued behind it
        if shm_full and outcome.error_kind in (protocol.EXCEPTION, protocol.CRASHED):
            # ENOSPC (or a program's death over it) in a /dev/shm sized at the memory cap:
            # memory, not a bug of the job's
            outcome = replace(
                outcome,
                error_kind=protocol.MEMORY_LIMIT,
                message=f"{SHM_FULL} (memory_limit + headroom): {outcome.message}",
            )
        return self.reply(job, outcome)

    def reply(self, job: protocol.RunJob, outcome: Outcome) -> bytes:
        """Encode the result as JobDone, or the failure (also of encoding it) as JobFailed."""
        if outcome.error_kind is not None:
            return self.failed(job, outcome)
        try:
            text = json.dumps(outcome.result, allow_nan=False)
            done = protocol.JobDone(job.job_id, text, outcome.duration, _peak(outcome))
            return protocol.encode(done, self.spec.max_frame)
        except (TypeError, ValueError, RecursionError) as exc:
            why = f"result is not JSON-serialisable: {one_line(exc)}"
            failed = replace(outcome, error_kind=protocol.EXCEPTION, message=why)
        except protocol.FrameTooLarge as exc:
            why = f"result too large to send: {exc}"
            failed = replace(outcome, error_kind=protocol.EXCEPTION, message=why)
        except MemoryError:
            why = "MemoryError while encoding the result"
            failed = replace(outcome, error_kind=protocol.MEMORY_LIMIT, message=why)
        return self.failed(job, failed)

    def failed(self, job: protocol.RunJob, outcome: Outcome) -> bytes:
        """Encode a JobFailed frame, adding the cap and the peak to a memory_limit message."""
        peak = _peak(outcome)
        message = outcome.message
        if outcome.error_kind == protocol.MEMORY_LIMIT and not message.startswith(SHM_FULL):
            message += self._memory_detail(peak)
        failed = protocol.JobFailed(
            job.job_id,
            outcome.error_kind or protocol.EXCEPTION,
            message[:MAX_TEXT],
            outcome.tail[-MAX_TEXT:],
            outcome.duration,
            peak,
        )
        return protocol.encode(failed, self.spec.max_frame)

    def _memory_detail(self, peak: int | None) -> str:
        """``: allocation refused under RLIMIT_DATA 384 MiB (memory_limit 256 MiB), peak ...``."""
        limit = self.spec.memory_limit
        under = self.cap.describe() if self.cap else "no memory rlimit"
        of = f" (memory_limit {limit // MIB} MiB)" if limit is not None else ""
        peak_text = f", peak RSS {peak // MIB} MiB" if peak is not None else ""
        return f": allocation refused under {under}{of}{peak_text}"

    # --- between jobs ---

    def _after_job(self) -> None:
        """Count the job, flush the handler's output, and recycle when due."""
        self.jobs_done += 1
        flush_stdio()
        reason = self.recycle_reason()
        if reason is not None:
            self.send(protocol.Recycling(reason))
            raise WorkerExit(exitcodes.RECYCLE)

    def recycle_reason(self) -> str | None:
        """Why this worker should be replaced now, or None."""
        spec = self.spec
        if spec.max_jobs_per_worker is not None and self.jobs_done >= spec.max_jobs_per_worker:
            return f"max_jobs_per_worker reached ({self.jobs_done} jobs)"
        if spec.recycle_rss is None and spec.memory_limit is None:
            return None  # no RSS line can apply: nothing to read
        rss = limits.current_rss()
        if self.jobs_done == 1:
            self.rss_cap = self._rss_cap(rss)
        cap = self.rss_cap
        if cap is None or rss is None or rss <= cap:
            return None
        # "Stays above": garbage and memory glibc kept after free() are not a leak.
        gc.collect()
        limits.trim_heap()
        rss = limits.current_rss()
        if rss is None or rss <= cap:
            return None
        if cap == spec.recycle_rss:
            return f"RSS {rss // MIB} MiB after the job is above recycle_rss {cap // MIB} MiB"
        limit = spec.memory_limit or 0
        return (
            f"RSS {rss // MIB} MiB after the job is near memory_limit {limit // MIB} MiB "
            "(a leak?): replaced before it must be killed mid-job"
        )

    def _rss_cap(self, warm_rss: int | None) -> int | None:
        """The RSS after a job above which this worker is replaced: ``recycle_rss``, or lower,
        ``NEAR_LIMIT`` of ``memory_limit`` (so a leak of any pace is caught here, between
        jobs, before the parent's watchdog must kill the worker mid-job and fail whatever job
        then runs). Not the latter when the first job left the worker within ``ROOM_TO_GROW``
        of it (``warm_rss``: what it loaded once, a model or a cache, is not a leak, and a
        fresh worker would load it again)."""
        spec = self.spec
        caps = [spec.recycle_rss] if spec.recycle_rss is not None else []
        if spec.memory_limit is not None and warm_rss is not None:
            near = int(spec.memory_limit * NEAR_LIMIT)
            if near >= warm_rss + ROOM_TO_GROW:
                caps.append(near)
        return min(caps) if caps else None


def _peak(outcome: Outcome) -> int | None:
    """The job's peak: the worker's VmHWM, plus its program's for a command handler."""
    peak = limits.peak_rss()
    if outcome.child_peak and peak is not None:
        return peak + outcome.child_peak
    return peak


def _run_command(handler: CommandHandler, payload: Any) -> Outcome:
    """``handler.run``, which should never raise; if it does anyway (a bug, an OSError in a
    place not foreseen) the job fails as ``exception`` saying what failed, and the worker
    lives on."""
    try:
        return handler.run(payload)
    except Exception as exc:
        message = f"the command runner failed: {one_line(exc, MAX_TEXT - 40)}"
        return Outcome(error_kind=protocol.EXCEPTION, message=message)
