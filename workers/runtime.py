"""The worker's whole life after the fork: ``main(conn_fd, spec)``; it never returns.

::

    fork ─> setup ─────────────────────────────> Ready ─> loop
            join the memory cgroup the parent prepared (cgroup_fd), if any
            signals: INT/TERM ignored, parent's handlers and wake-up fd dropped, mask cleared
            PR_SET_PDEATHSIG=SIGKILL, privilege drop, PDEATHSIG again, getppid() check
            RLIMIT_CORE 0, memory rlimit, RLIMIT_NPROC, child subreaper,
            title "fleetd: pool#slot idle"

    loop:  RunJob ─> reset VmHWM ─> handler(payload) in this thread (a command handler:
                         │          its program, workers.command)
                         ├─> every process the job left is killed (workers.tree)
                         └─> JobDone(result) | JobFailed(exception|permanent|memory_limit)
                             └─> recycle? ─> Recycling ─> exit RECYCLE
           Ping ─> Pong(rss)        Shutdown ─> exit OK
           Release ─> Returned(job_id) for every RunJob received and not started
           EOF / broken pipe ─> exit PARENT_GONE      bad frame ─> exit PROTOCOL_ERROR

Frames are acted on in the order the parent sent them. The parent may send several RunJob
frames ahead (it does for pools whose jobs are short: ``supervisor.policy.pipeline_depth``);
they wait in the inbox. Before acting on a waiting frame the worker reads, without blocking,
whatever else has arrived, so a Release sent behind queued jobs is seen before the next of them
starts.

The worker only knows its connection, its handler table and its limits. It never enforces
deadlines or memory_limit itself: the parent kills it (SIGKILL) for a timeout, a lease it lost,
an RSS over the limit or a drain. The handler runs in the main thread, so the worker reads no
frame while a job runs; a frame the parent sends meanwhile waits in the socket.

SIGINT and SIGTERM are set to SIG_IGN, and an ignored disposition survives exec: processes a
handler starts ignore them too. That keeps them running through a drain like the job itself
(systemd sends SIGTERM to every process of the unit), and the parent's SIGKILL of the worker's
process group still ends them; but ``Popen.terminate()`` will not stop them. Handlers should
use ``kill()``, or restore SIG_DFL in the subprocess.

Exits go through ``os._exit``: the worker is a fork of the parent, and returning or unwinding
into the parent's stack (its ``finally`` blocks, atexit hooks, buffered output) would run the
parent's code twice.
"""

from __future__ import annotations

import _signal
import contextlib
import gc
import json
import os
import select
import signal
import sys
import traceback
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from workers import (
    command,
    context,
    exitcodes,
    limits,
    logs,
    privileges,
    proctitle,
    protocol,
    scratch,
    tree,
)
from workers.command import CommandHandler
from workers.errors import SoftTimeout, one_line
from workers.handlers import Handler
from workers.outcome import MAX_TEXT, Outcome, call

MIB = 1024 * 1024
NEAR_LIMIT = 7 / 8  # of memory_limit: RSS after a job above it replaces the worker
ROOM_TO_GROW = 16 * MIB
ALARM_SLACK = 0.5  # seconds the deadline alarm may fire after the backstop (arm_between)
SHM_FULL = "filled its private /dev/shm"  # ... unless its first job left it closer to it than this


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, fixed before the fork.

    ``handlers`` are already imported (``workers.handlers.load_handlers``). Sizes are bytes.
    ``memory_limit`` caps memory through the ``rlimit_policy`` rlimit ("data", "as" or "off")
    at ``memory_limit + rlimit_headroom`` (see ``workers.limits``); the exact limit on RSS is
    the parent's watchdog. ``recycle_rss``: exit after a job that leaves RSS above it (and,
    with a ``memory_limit``, after one that leaves it near that: ``NEAR_LIMIT``).
    ``user``/``group`` (names or ids) need the parent to run as root.
    """

    pool: str
    slot: int
    handlers: Mapping[str, Handler]
    parent_pid: int
    memory_limit: int | None = None
    rlimit_policy: str = "data"
    rlimit_headroom: int = limits.DEFAULT_HEADROOM
    max_jobs_per_worker: int | None = None
    recycle_rss: int | None = None
    nproc_limit: int | None = None
    user: str | int | None = None
    group: str | int | None = None
    max_frame: int = protocol.MAX_FRAME
    # an fd on the cgroup.procs of the worker's memory cgroup, made by the parent before the
    # fork: the worker joins it itself, first thing (None: no cgroup, or the parent moved it)
    cgroup_fd: int | None = None
    # a private /dev/shm (workers.tree.private_shm), at most memory_limit in size, emptied
    # after every job; needs root (else the host's is shared, and said once on stderr)
    private_shm: bool = False
    # seconds after a job starts at which the worker ends itself (``limits.DeadlineAlarm``):
    # a backstop behind the parent's own kill, which comes earlier (timeout, soft window).
    # None: no alarm
    hard_deadline: float | None = None
    # the supervisor's directory under which this worker makes its own for its command jobs'
    # folders (workers.scratch); the supervisor removes the worker's when it reaps it
    scratch_root: str | None = None
    # kill what a job left running when it ends (workers.tree.end_all); a command's own
    # processes are killed by its runner whatever this says
    end_job_tree: bool = True
    # jobs run at once, each in a thread or an asyncio task (workers/slots.py); ``threaded``:
    # run the slot runtime even with one slot (a pool with an ``async def`` handler)
    slots: int = 1
    threaded: bool = False

    def __post_init__(self) -> None:
        # Checked in the parent, before the fork: a bad spec must not become a fork loop.
        if self.rlimit_policy not in limits.POLICIES:
            raise ValueError(f"rlimit_policy {self.rlimit_policy!r} not in {limits.POLICIES}")
        for name in ("memory_limit", "max_jobs_per_worker", "recycle_rss", "nproc_limit"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, not {value!r}")
        if self.rlimit_headroom < 0:
            raise ValueError(f"rlimit_headroom must not be negative, not {self.rlimit_headroom}")


class _Exit(Exception):
    """Unwind to ``main`` and exit with ``code``, saying ``why`` on stderr when given."""

    def __init__(self, code: int, why: str | None = None) -> None:
        super().__init__(code, why)
        self.code = code
        self.why = why


def main(
    conn_fd: int, spec: WorkerSpec, cancel_slot: protocol.CancelSlot | None = None
) -> NoReturn:
    """Run a worker on ``conn_fd`` (a blocking, connected socket or pipe) until told to stop.

    Call it in the child right after ``os.fork()``, from the parent's main thread, after the
    parent flushed ``sys.stdout``/``sys.stderr`` and closed what the child must not keep.
    Always ends in ``os._exit`` with a code from ``workers.exitcodes``. ``cancel_slot``: where
    the parent writes the id of the job its ``CANCEL_SIGNAL`` is about (``protocol.CancelSlot``).
    """
    code = exitcodes.INTERNAL_ERROR
    # Every object inherited from the parent (its modules, the handlers, their data) goes to
    # the permanent generation: the cyclic GC never walks them, so a collection in the worker
    # does not write to their headers and copy their pages. Measured: a full collection in a
    # fresh worker made 21 MiB of the supervisor's pages private without this, none with it.
    # O(1) (list splices); cycles among inherited objects are never collected here (few).
    gc.freeze()
    try:
        context.use_cancel_slot(cancel_slot)
        if spec.threaded or spec.slots > 1:
            from workers.slots import SlotWorker  # imports this module: not at the top

            worker: _Worker = SlotWorker(conn_fd, spec)
        else:
            worker = _Worker(conn_fd, spec)
        worker.setup()
        worker.serve()
    except _Exit as stop:
        code = stop.code
        if stop.why:
            _say(spec, stop.why)
    except BaseException:
        _say(spec, "internal error", "ERROR", traceback.format_exc())
    finally:
        _flush_stdio()
        os._exit(code)


class _Worker:
    """The worker's state: its connection, spec, memory cap and job count. One thread."""

    def __init__(self, conn_fd: int, spec: WorkerSpec) -> None:
        self.fd = conn_fd
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
        self.reader = protocol.FrameReader(spec.max_frame)
        self.inbox: deque[protocol.Message] = deque()  # received, not yet acted on
        self.poller = select.poll()
        self.poller.register(conn_fd, select.POLLIN)

    # --- setup ---

    def setup(self) -> None:
        """Everything between the fork and ``Ready``; failures exit SETUP_FAILED."""
        self._join_cgroup()  # first: what the worker touches from here on is charged to it
        if self.spec.private_shm and os.geteuid() == 0:  # before the privilege drop
            limit = self.spec.memory_limit
            why = tree.private_shm(limit + self.spec.rlimit_headroom if limit else None)
            self.own_shm = why is None
            self.shm_fresh = tree.shm_baseline() if self.own_shm else None
            if why is not None and scratch.first_time(self.spec.scratch_root, "shm"):
                _say(self.spec, f"shares the host's /dev/shm: {why} (said once)")
        _reset_signals()
        os.set_blocking(self.fd, True)
        limits.set_pdeathsig(signal.SIGKILL)  # at once: covers the privilege drop below
        if self.spec.max_jobs_per_worker != 1:  # the first job needs no reset
            limits.prepare_peak_reset()  # before the uid change makes /proc/self root's
        self._make_scratch()  # before the uid change: owned by the user it becomes
        self._drop_privileges()
        limits.set_pdeathsig(signal.SIGKILL)  # again: a uid or gid change cleared it
        if os.getppid() != self.spec.parent_pid:
            raise _Exit(exitcodes.PARENT_GONE, "the parent exited before PDEATHSIG was set")
        self._apply_limits()
        # the job's processes that lose their parent (a daemon: double fork, setsid) come
        # to this worker, not init: counted, and killed when the job ends (workers.tree)
        self.subreaper = tree.become_subreaper()
        if self.spec.hard_deadline is not None:
            try:
                self.alarm = limits.DeadlineAlarm()
            except (OSError, AttributeError) as exc:  # no POSIX timers: the parent's kill only
                _say(self.spec, f"no deadline alarm ({exc}); the supervisor's kill only")
        proctitle.set_title(proctitle.title_idle(self.spec.pool, self.spec.slot))
        self._send(protocol.Ready(os.getpid()))

    def _join_cgroup(self) -> None:
        """Write "0" (this process) to the cgroup.procs fd the parent prepared, and close it.
        A refusal is said on stderr: the worker then runs without its cgroup (the rlimit
        and the watchdog stay)."""
        fd = self.spec.cgroup_fd
        if fd is None:
            return
        try:
            os.write(fd, b"0")
        except OSError as exc:
            _say(self.spec, f"could not join its memory cgroup: {exc}")
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

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

    def _make_scratch(self) -> None:
        """This worker's directory for its command jobs' folders (``workers.scratch``); none
        when it has no command handler."""
        if self.spec.scratch_root is None or not command.runs_commands(self.spec.handlers):
            return
        try:
            identity = privileges.resolve(self.spec.user, self.spec.group)
        except KeyError:
            identity = None  # _drop_privileges says why and exits
        owner = None
        if identity is not None:
            owner = (-1 if identity.uid is None else identity.uid, identity.gid)
        command.FOLDER_ROOT = scratch.make_worker_dir(
            self.spec.scratch_root, self.spec.pool, self.spec.slot, owner
        )

    def _drop_privileges(self) -> None:
        """Switch to the pool's user/group, if any."""
        try:
            identity = privileges.resolve(self.spec.user, self.spec.group)
            if identity is not None:
                privileges.drop(identity)
        except (KeyError, OSError) as exc:
            why = f"setup failed: cannot switch to user={self.spec.user!r} "
            raise _Exit(exitcodes.SETUP_FAILED, why + f"group={self.spec.group!r}: {exc}") from exc

    def _apply_limits(self) -> None:
        """RLIMIT_CORE 0, the memory cap and RLIMIT_NPROC."""
        limits.disable_core_dumps()
        spec = self.spec
        try:
            if spec.memory_limit is not None:
                self.cap = limits.apply_memory_cap(
                    spec.memory_limit, spec.rlimit_policy, self._rlimit_headroom()
                )
            if spec.nproc_limit is not None:
                limits.limit_processes(spec.nproc_limit)
        except (OSError, ValueError) as exc:
            raise _Exit(exitcodes.SETUP_FAILED, f"setup failed: {exc}") from exc

    def _rlimit_headroom(self) -> int:
        """Bytes the memory rlimit allows above ``memory_limit`` (a worker with slots adds
        its threads' stacks: workers/slots.py)."""
        return self.spec.rlimit_headroom

    # --- the loop ---

    def serve(self) -> NoReturn:
        """Answer frames until Shutdown, EOF or a recycle."""
        while True:
            msg = self._read()
            if isinstance(msg, protocol.RunJob):
                self._send_bytes(self._run(msg))
                self._after_job()
            elif isinstance(msg, protocol.Ping):
                self._send(protocol.Pong(msg.seq, limits.current_rss()))
            elif isinstance(msg, protocol.Shutdown):
                raise _Exit(exitcodes.OK)
            else:
                why = f"unexpected {type(msg).__name__} frame from the parent"
                raise _Exit(exitcodes.PROTOCOL_ERROR, why)

    def _read(self) -> protocol.Message:
        """The next message to act on. Blocks only when none is waiting; otherwise first
        takes in, without blocking, what else has arrived (a Release, say)."""
        if self.inbox and self.poller.poll(0):
            self._receive()
        while not self.inbox:
            self._idle_title()  # a Release may have taken back the jobs that were queued
            self._receive()
        return self.inbox.popleft()

    def _idle_title(self) -> None:
        """Say idle, unless the title already does (it is not rewritten between jobs); and
        disarm the deadline alarm (no job runs)."""
        if self.alarm is not None and self.alarm.fires_at is not None:
            self.alarm.arm(0)
        if self.busy_title:
            proctitle.set_title(proctitle.title_idle(self.spec.pool, self.spec.slot))
            self.busy_title = False

    def _receive(self) -> None:
        """One (blocking) read; its complete frames join the inbox, and a Release hands back
        the jobs waiting there. EOF or a read error means the parent is gone."""
        try:
            data = os.read(self.fd, 65536)
        except OSError as exc:
            raise _Exit(exitcodes.PARENT_GONE) from exc
        if not data:
            if self.reader.pending:
                why = f"end of file inside a frame ({self.reader.pending} bytes)"
                raise _Exit(exitcodes.PROTOCOL_ERROR, f"bad frame from the parent: {why}")
            raise _Exit(exitcodes.PARENT_GONE)
        try:
            messages = self.reader.feed(data)
        except protocol.ProtocolError as exc:
            raise _Exit(exitcodes.PROTOCOL_ERROR, f"bad frame from the parent: {exc}") from exc
        for msg in messages:
            if isinstance(msg, protocol.Release):
                self._return_waiting_jobs()
            else:
                self.inbox.append(msg)

    def _return_waiting_jobs(self) -> None:
        """Answer a Release: every RunJob in the inbox goes back to the parent, unstarted."""
        jobs = [m for m in self.inbox if isinstance(m, protocol.RunJob)]
        if not jobs:
            return
        rest = [m for m in self.inbox if not isinstance(m, protocol.RunJob)]
        self.inbox = deque(rest)
        frames = b"".join(
            protocol.encode(protocol.Returned(job.job_id), self.spec.max_frame) for job in jobs
        )
        self._send_bytes(frames)

    def _send(self, msg: protocol.Message) -> None:
        """Write one frame; a broken pipe means the parent is gone."""
        self._send_bytes(protocol.encode(msg, self.spec.max_frame))

    def _send_bytes(self, frame: bytes) -> None:
        """Write an encoded frame, resuming partial writes."""
        view = memoryview(frame)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            raise _Exit(exitcodes.PARENT_GONE) from exc

    # --- one job ---

    def _run(self, job: protocol.RunJob) -> bytes:
        """Run one job; the encoded JobDone or JobFailed frame to send."""
        spec = self.spec
        handler = spec.handlers.get(job.kind)
        if handler is None:
            why = f"no handler for kind {job.kind!r} in pool {spec.pool!r}"
            return self._failed(job, Outcome(error_kind=protocol.EXCEPTION, message=why))
        try:
            payload = json.loads(job.payload)
        except ValueError as exc:  # the client checks payloads, so retrying cannot help
            why = f"payload is not valid JSON: {exc}"
            return self._failed(job, Outcome(error_kind=protocol.PERMANENT, message=why))
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
                outcome = call(_soft_timeout_window(handler), payload)
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
        return self._reply(job, outcome)

    def _reply(self, job: protocol.RunJob, outcome: Outcome) -> bytes:
        """Encode the result as JobDone, or the failure (also of encoding it) as JobFailed."""
        if outcome.error_kind is not None:
            return self._failed(job, outcome)
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
        return self._failed(job, failed)

    def _failed(self, job: protocol.RunJob, outcome: Outcome) -> bytes:
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
        _flush_stdio()
        reason = self._recycle_reason()
        if reason is not None:
            self._send(protocol.Recycling(reason))
            raise _Exit(exitcodes.RECYCLE)

    def _recycle_reason(self) -> str | None:
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


def _peak(outcome: Outcome) -> int | None:
    """The job's peak: the worker's VmHWM, plus its program's for a command handler."""
    peak = limits.peak_rss()
    if outcome.child_peak and peak is not None:
        return peak + outcome.child_peak
    return peak


_in_handler = False  # a handler runs in the main thread: the soft signal raises only then


def _raise_soft_timeout(signum: int, frame: object) -> None:
    if _in_handler:
        raise SoftTimeout("the job ran past its timeout; the worker is killed shortly")


def _run_command(handler: CommandHandler, payload: Any) -> Outcome:
    """``handler.run``, which should never raise; if it does anyway (a bug, an OSError in a
    place not foreseen) the job fails as ``exception`` saying what failed, and the worker
    lives on."""
    try:
        return handler.run(payload)
    except Exception as exc:
        message = f"the command runner failed: {one_line(exc, MAX_TEXT - 40)}"
        return Outcome(error_kind=protocol.EXCEPTION, message=message)


def _soft_timeout_window(handler: Handler) -> Handler:
    """Raise ``SoftTimeout`` for the parent's soft-timeout signal only while the handler
    itself runs.

    The signal is never blocked (a mask would be inherited by the threads and programs a
    handler starts, and opening and closing it cost three system calls a job): one that
    arrives between jobs, too late for the job it was meant for, interrupts at most a read
    or a write, which is resumed, and is ignored. One that arrives while the handler runs
    raises inside it, or in this wrapper right after it returns (Python runs signal handlers
    between bytecodes): either way within ``call``, so the job fails as ``timeout``."""

    def run(payload: Any) -> Any:
        global _in_handler
        _in_handler = True
        try:
            return handler(payload)
        finally:
            _in_handler = False

    return run


# signal.pthread_sigmask turns the old mask it returns into a set of Signals members: three
# times the cost of the system call. The C function underneath does not.
_sigmask = getattr(_signal, "pthread_sigmask", signal.pthread_sigmask)


_SIGNALS = tuple(sorted(int(s) for s in signal.valid_signals()))

# What the parent's signal setup left that a worker must undo, when the parent knows it
# (``prepare_forker``): the signals it has Python handlers for, and whether it has a wake-up
# fd. None: not known, look (every signal: ~0.3 ms of a fresh worker's boot, measured).
_parents_signals: tuple[tuple[int, ...], bool] | None = None


def _reset_signals() -> None:
    """Ignore SIGINT/SIGTERM; drop what the parent's signal setup left in this process.

    The parent's Python handlers refer to the parent's objects, and its wake-up fd is the
    parent's loop: a signal delivered here would write into it. A mask the parent held across
    the fork is inherited too. SIGPIPE stays ignored (Python's default), so a write to a dead
    parent raises BrokenPipeError instead of killing the worker silently.
    """
    handled, wakeup_fd = _parents_signals or (_python_handled(), True)
    if wakeup_fd:
        signal.set_wakeup_fd(-1)
    for sig in handled:
        _signal.signal(sig, _signal.SIG_DFL)
    _signal.signal(signal.SIGINT, _signal.SIG_IGN)
    _signal.signal(signal.SIGTERM, _signal.SIG_IGN)
    _signal.signal(protocol.SOFT_TIMEOUT_SIGNAL, _raise_soft_timeout)
    _signal.signal(protocol.CANCEL_SIGNAL, context.note_cancel)  # sets a flag; never raises
    _sigmask(signal.SIG_SETMASK, ())


def _python_handled() -> tuple[int, ...]:
    """The signals this process has a Python handler for."""
    handled = []
    for sig in _SIGNALS:  # the C functions: plain ints, no Signals enum per call (~0.3 ms)
        try:
            if callable(_signal.getsignal(sig)):
                handled.append(sig)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP and friends
            continue
    return tuple(handled)


REHEARSALS = 64  # runs of each path: past the interpreter's warm-up, which specialises code


def prepare_forker() -> None:
    """Make this process (the forker, once its handlers are imported) a cheaper one to fork
    workers from. A fresh worker pays for every page it writes that it still shares with
    the forker: a copy-on-write fault, ~2.7 µs here with a memory cgroup (measured), and
    a fresh worker took ~700 of them to run one no-op job. So, once, here:

    - note what a worker must undo of this process's signal setup (the handlers a handler
      module installed at import): it undoes that and no more. The forker keeps them (a
      library's SIGALRM timer goes on running its handler here), but for a wake-up fd,
      dropped here, and SIGINT/SIGTERM/SIGCHLD, which ``forker.serve`` sets back;
    - the pure code every job runs (frames both ways, the title, JSON, the job context, a
      handler call) is run ``REHEARSALS`` times: the interpreter specialises a function's
      code in place on its first runs, and in a fresh worker every such write is a fault;
    - ``gc.freeze()``: what the forker holds is never walked by a collection here or there.

    What it cannot do: the handlers' own code warms up in each worker (only a job runs it);
    a handler the forker's own code installs later (a signal handler that installs another)
    is not seen, and its workers keep it."""
    global _parents_signals
    # a wake-up fd an import left (an event loop's self-pipe) is dropped here too: no loop
    # reads it in the forker, and once full every signal would print a complaint
    signal.set_wakeup_fd(-1)
    _parents_signals = (_python_handled(), False)
    for _ in range(REHEARSALS):
        _rehearse(protocol.MAX_FRAME)
    with contextlib.suppress(OSError, AttributeError):  # no POSIX timers: said per worker
        limits.DeadlineAlarm.prepare()
    gc.collect()
    gc.freeze()


def _rehearse(max_frame: int) -> None:
    """One run of the pure paths a job takes through a worker (see ``prepare_forker``)."""
    run = protocol.RunJob(1, "kind", "{}", 1, 0.0, "token")
    frames = protocol.encode(run, max_frame) + protocol.encode(protocol.Ping(1), max_frame)
    protocol.FrameReader(max_frame).feed(frames)
    outcome = call(json.loads, run.payload)
    json.dumps(outcome.result, allow_nan=False)
    for reply in (
        protocol.Ready(1),
        protocol.JobDone(1, "null", 0.0, None),
        protocol.JobFailed(1, protocol.EXCEPTION, "", "", 0.0, None),
        protocol.Pong(1, None),
        protocol.Recycling(""),
    ):
        protocol.encode(reply, max_frame)
    proctitle.title_idle("pool", 1)
    proctitle.title_busy("pool", 1, 1, "kind", 0)
    context.unbind(context.bind(context.JobContext(1, "kind", 1, 0.0, "pool")))
    _Worker(0, WorkerSpec(pool="pool", slot=1, handlers={}, parent_pid=0))  # its parts only


def _flush_stdio() -> None:
    """Flush the handler's buffered output: ``os._exit`` would drop it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def _say(spec: WorkerSpec, text: str, level: str = "WARNING", exc: str | None = None) -> None:
    """One unbuffered line on stderr, prefixed with the worker's name (and a traceback
    after it): a JSON object where the fleet logs JSON (``log_format = "json"``: every line
    of its log is one; the traceback as ``exc``, as the supervisor's own lines carry it)."""
    name = f"worker {spec.pool}#{spec.slot} (pid {os.getpid()})"
    if logs.json_lines:
        line = logs.json_line(level, "fleetd.worker", f"{name}: {text}", exc) + "\n"
    else:
        line = f"fleetd {name}: {text}\n" + (exc or "")
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", "replace"))
