"""A worker with slots: up to ``spec.slots`` jobs at once, for pools whose jobs wait (``io``).

::

    main thread: frames in (poll on the connection and a wake-up pipe)
        RunJob ─> a thread of its own (a plain handler), or a task on the worker's one event
                  loop (an ``async def`` handler; the loop runs in a thread of its own)
        Ping ─> Pong(rss)     Shutdown ─> exit OK     Release ─> Returned (not started)
    a slot (thread or task): bind its job (its own context) ─> handler ─> JobDone/JobFailed,
        written whole under the send lock ─> the main thread is woken (a free slot)

Each job has its own result, ``current_job()`` (a context of its own: ``context.bind_slot``)
and cancel flag; its lease, deadline and heartbeat are the parent's, per job.

What a thread cannot do, and what the worker does instead:
- A thread cannot be killed. A plain handler past its deadline, cancelled, or over the memory
  limit ends the whole worker (the parent's SIGKILL); the parent fails that job and releases
  its siblings uncounted (supervisor/run/exits.py ``slot_verdicts``).
- An ``async def`` handler is cancelled cooperatively at its deadline (``asyncio.timeout``:
  ``task.cancel()``) and on an operator's cancel; it ends ``timeout`` (or cancelled) and the
  worker lives on. One that swallows the cancellation is killed by the parent a grace later.
- Signals reach only the main thread: no ``SoftTimeout`` in slots (the config refuses
  ``soft_timeout`` with slots), and a cancel only sets the job's flag (no SIGTERM to the
  worker's group, which holds the other slots' processes too).
- Memory and peak RSS are the worker's: every slot's job reports the worker's VmHWM.
- Processes a job leaves are not killed at its end (they may be a sibling's): nothing runs
  ``end_job_tree`` per job here; the config refuses command handlers with slots.

The deadline alarm (``limits.DeadlineAlarm``) is armed for the soonest backstop of the jobs
running, so a worker whose parent cannot kill it still ends itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import select
import threading
import time
from collections import deque
from typing import Any

from workers import context, exitcodes, limits, proctitle, protocol
from workers.exiting import WorkerExit, flush_stdio
from workers.outcome import Outcome, call, failure
from workers.spec import WorkerSpec
from workers.worker import Worker


class SlotWorker(Worker):
    """A ``Worker`` whose jobs run in slots. ``running`` and ``recycle`` are shared with the
    slot threads and guarded by ``lock``; everything else is the main thread's."""

    def __init__(self, conn_fd: int, spec: WorkerSpec) -> None:
        super().__init__(conn_fd, spec)
        self.lock = threading.Lock()  # running, recycle, jobs_done, the alarm, sends
        self.running: dict[int, float] = {}  # job id -> monotonic backstop instant
        self.waiting: deque[protocol.RunJob] = deque()  # sent beyond the free slots
        self.arrived: dict[int, float] = {}  # job id -> Unix time its RunJob was taken in
        self.recycle: str | None = None  # said Recycling: start nothing more, exit when idle
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.poller.register(self.wake_r, select.POLLIN)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: dict[int, asyncio.Task[Any]] = {}  # the loop thread's

    def rlimit_headroom(self) -> int:
        threading.stack_size(limits.SLOT_STACK)  # before the first slot's thread
        return self.spec.rlimit_headroom + limits.slot_stacks(self.spec.slots)

    # --- the main thread ---

    def serve(self) -> None:  # type: ignore[override]
        while True:
            for fd, _ in self.poller.poll():
                if fd == self.wake_r:
                    self._drain_wake()
                else:
                    self.receive()
            while self.inbox:
                self._act(self.inbox.popleft())
            self._start_waiting()
            with self.lock:
                done = self.recycle is not None and not self.running
            if done:
                raise WorkerExit(exitcodes.RECYCLE)

    def _act(self, msg: protocol.Message) -> None:
        if isinstance(msg, protocol.RunJob):
            self.arrived[msg.job_id] = time.time()
            self.waiting.append(msg)
        elif isinstance(msg, protocol.Ping):
            self.send(protocol.Pong(msg.seq, limits.current_rss()))
        elif isinstance(msg, protocol.Shutdown):
            raise WorkerExit(exitcodes.OK)
        else:
            why = f"unexpected {type(msg).__name__} frame from the parent"
            raise WorkerExit(exitcodes.PROTOCOL_ERROR, why)

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _start_waiting(self) -> None:
        """Start waiting jobs while slots are free; after Recycling, hand them back."""
        while self.waiting:
            with self.lock:
                recycling = self.recycle is not None
                full = len(self.running) >= self.spec.slots
            if recycling:
                self.return_waiting_jobs()
                return
            if full:
                return
            self._start(self.waiting.popleft())

    def return_waiting_jobs(self) -> None:
        for job in self.waiting:
            self.arrived.pop(job.job_id, None)
        self.inbox.extend(self.waiting)
        self.waiting.clear()
        super().return_waiting_jobs()

    def send_bytes(self, frame: bytes) -> None:
        with self.lock:
            super().send_bytes(frame)

    def _start(self, job: protocol.RunJob) -> None:
        spec = self.spec
        # its deadline was counted from the send; a job that waited here (behind a pipeline's
        # running job, or for a slot) is given its whole timeout from its start, as the
        # parent counts it (an async task is cancelled at this deadline)
        waited = time.time() - self.arrived.pop(job.job_id, time.time())
        if waited > 0:
            job = dataclasses.replace(job, deadline=job.deadline + waited)
        handler = spec.handlers.get(job.kind)
        with self.lock:
            backstop = spec.hard_deadline if spec.hard_deadline is not None else float("inf")
            self.running[job.job_id] = time.monotonic() + backstop
            self._arm_alarm()
            count = len(self.running)
        proctitle.set_title(_title(spec, count))
        self.busy_title = True
        if handler is not None and inspect.iscoroutinefunction(handler):
            loop = self._event_loop()
            asyncio.run_coroutine_threadsafe(self._async_job(job, handler), loop)
            return
        thread = threading.Thread(target=self._thread_job, args=(job,), daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had (RLIMIT_NPROC, memory): this job
            # fails, the worker and its other slots live on
            why = f"could not start a thread for the job's slot: {exc}"
            outcome = Outcome(error_kind=protocol.EXCEPTION, message=why)
            self._finish(job, self.failed(job, outcome))

    # --- the slots ---

    def _thread_job(self, job: protocol.RunJob) -> None:
        limits.name_thread(job.job_id)  # the parent blames a memory kill by page faults
        frame = b""
        try:
            prepared = self._prepare(job)
            if isinstance(prepared, bytes):
                frame = prepared
            else:
                handler, payload = prepared
                ctx = _context(job, self.spec.pool)
                token = context.bind_slot(ctx)
                try:
                    outcome = call(handler, payload)
                finally:
                    self._check_fork()
                    context.unbind_slot(ctx, token)
                frame = self.reply(job, outcome)
        finally:
            self._finish(job, frame)

    async def _async_job(self, job: protocol.RunJob, handler: Any) -> None:
        frame = b""
        try:
            prepared = self._prepare(job)
            if isinstance(prepared, bytes):
                frame = prepared
                return
            _, payload = prepared
            ctx = _context(job, self.spec.pool)
            token = context.bind_slot(ctx)
            task = asyncio.current_task()
            if task is not None:
                self.tasks[job.job_id] = task
            if job.job_id in context.slot_cancelled and task is not None:
                task.cancel()  # cancelled before it started
            try:
                outcome = await _await_outcome(handler, payload, job.deadline)
            finally:
                self.tasks.pop(job.job_id, None)
                self._check_fork()
                context.unbind_slot(ctx, token)
            frame = self.reply(job, outcome)
        finally:
            self._finish(job, frame)

    def _prepare(self, job: protocol.RunJob) -> bytes | tuple[Any, Any]:
        """The handler and the payload, or the encoded failure when there are none."""
        handler = self.spec.handlers.get(job.kind)
        if handler is None:
            why = f"no handler for kind {job.kind!r} in pool {self.spec.pool!r}"
            return self.failed(job, Outcome(error_kind=protocol.EXCEPTION, message=why))
        try:
            return handler, json.loads(job.payload)
        except ValueError as exc:
            why = f"payload is not valid JSON: {exc}"
            return self.failed(job, Outcome(error_kind=protocol.PERMANENT, message=why))

    def _check_fork(self) -> None:
        if os.getpid() != self.pid:  # a handler forked and its child came back here
            os._exit(exitcodes.INTERNAL_ERROR)

    def _finish(self, job: protocol.RunJob, frame: bytes) -> None:
        """Send the job's result (written whole under the lock: frames never interleave),
        count it, say Recycling once when due, and wake the main thread."""
        reason = None
        with self.lock:
            self.running.pop(job.job_id, None)
            self._arm_alarm()
            self.jobs_done += 1
            idle = not self.running
        try:
            if frame:
                self.send_bytes(frame)
            flush_stdio()
            if self.recycle is None:
                reason = self.recycle_reason()
            if reason is not None:
                with self.lock:
                    said, self.recycle = self.recycle is not None, reason
                if not said:
                    self.send(protocol.Recycling(reason))
        except WorkerExit as stop:  # the parent is gone: nothing to run for
            flush_stdio()
            os._exit(stop.code)
        if idle:
            proctitle.set_title(proctitle.title_idle(self.spec.pool, self.spec.slot))
        os.write(self.wake_w, b"x")

    def _arm_alarm(self) -> None:
        """Arm the deadline alarm for the soonest backstop of the running jobs (0: none).
        Called under ``lock``."""
        if self.alarm is None:
            return
        if not self.running:
            self.alarm.arm(0)
            return
        soonest = min(self.running.values())
        if soonest != float("inf"):
            self.alarm.arm(max(0.001, soonest - time.monotonic()))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The worker's one event loop, running in a thread of its own (started once)."""
        if self.loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, daemon=True)
            thread.start()
            self.loop = loop
            context.on_slot_cancel = self._cancel_task
        return self.loop

    def _cancel_task(self, job_id: int) -> None:
        """An operator cancelled a running job: cancel its task, if it is an asyncio one
        (from the CANCEL_SIGNAL handler: only a thread-safe wake of the loop)."""
        loop = self.loop
        if loop is not None:
            loop.call_soon_threadsafe(self._cancel_in_loop, job_id)

    def _cancel_in_loop(self, job_id: int) -> None:
        task = self.tasks.get(job_id)
        if task is not None:
            task.cancel()


async def _await_outcome(handler: Any, payload: Any, deadline: float) -> Outcome:
    """Await the handler until the job's deadline; never raises. Past the deadline its task
    is cancelled (``timeout``); an operator's cancel ends it too (the store makes it
    cancelled whatever it reports)."""
    start = time.monotonic()
    scope = asyncio.timeout(max(0.0, deadline - time.time()))
    try:
        async with scope:
            outcome = Outcome(result=await handler(payload))
    except asyncio.CancelledError:
        why = "cancelled by an operator while running (its task was cancelled)"
        outcome = Outcome(error_kind=protocol.EXCEPTION, message=why)
    except BaseException as exc:
        if scope.expired():
            why = "ran past its timeout: its task was cancelled at the deadline"
            outcome = Outcome(error_kind=protocol.TIMEOUT, message=why)
        else:
            outcome = failure(exc)
    outcome.duration = time.monotonic() - start
    return outcome


def _context(job: protocol.RunJob, pool: str) -> context.JobContext:
    return context.JobContext(job.job_id, job.kind, job.attempt, job.deadline, pool)


def _title(spec: WorkerSpec, running: int) -> str:
    return f"fleetd: {spec.pool}#{spec.slot} {running}/{spec.slots} slots busy"
