"""``WorkerHandle``: the parent's view of one forked worker, and ``fork_worker``.

The supervisor's workers are forked by its forker (workers/forker.py, through
``supervisor.run.forklink``); ``fork_worker`` forks one from the calling process itself, for
``fleetd check``'s probe and the benchmarks.

A worker is a forked child running ``workers.runtime.main`` on one end of a socketpair. The
parent writes ``RunJob`` frames and reads results from the other end, non-blocking, through the
loop. States::

    starting ──Ready──> idle ──RunJob──> busy ──last result──> idle
        │                 │                │
        └─────────────────┴──── exit ──────┴──> gone (reaped; the pool decides on a new one)

A busy worker holds ``running`` (the jobs it runs: one, or up to ``slots`` in a pool with
slots, workers/slots.py; ``job`` is the oldest) and, when the pool pipelines, ``queued``: jobs
sent behind it, not started, run in order. A result promotes the next.

Every field is owned by the supervisor's main thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

import psutil

from supervisor.model import Claimed
from supervisor.policy import KillKind, KillReason
from workers import protocol, runtime
from workers.forker import fork_blocked
from workers.runtime import WorkerSpec


class WorkerState(StrEnum):
    STARTING = "starting"  # forked, not Ready yet
    IDLE = "idle"
    BUSY = "busy"  # holds a job (and, pipelining, jobs queued behind it)
    STOPPING = "stopping"  # killed, recycling or told to stop: nothing more is sent to it


@dataclass(slots=True)
class InFlight:
    """A job sent to a worker. Times are monotonic seconds; a queued job's ``started`` and
    ``deadline`` are set when it becomes the worker's current job."""

    claimed: Claimed
    started: float
    deadline: float  # wall-clock timeout, as a monotonic instant (inf while queued)
    lease_expires: float  # when our lease runs out unless extended (monotonic)
    extensions: int = 0
    size: int = 0  # bytes of its RunJob frame, while it is queued


@dataclass
class WorkerHandle:
    pool: str
    slot: int
    pid: int
    sock: socket.socket
    spawned_at: float
    state: WorkerState = WorkerState.STARTING
    running: dict[int, InFlight] = field(default_factory=dict)  # by job id, oldest first
    slots: int = 1  # jobs it runs at once (workers/slots.py)
    queued: deque[InFlight] = field(default_factory=deque)  # sent behind ``job``, not started
    queued_bytes: int = 0  # frame bytes of ``queued``: bounded so a send never waits on them
    kill_reason: KillReason | None = None
    kill_target: int | None = None  # the job it ran when killed: the reason is about that job
    soft_signalled_at: float | None = None  # SoftTimeout sent to the running job
    soft_target: int | None = None  # the job the SoftTimeout was meant for
    killed_at: float | None = None
    last_rss: int | None = None
    jobs_done: int = 0
    recycling: bool = False  # it said Recycling: it exits now, starting nothing more
    reader: protocol.FrameReader = field(default_factory=protocol.FrameReader)
    proc: psutil.Process | None = None
    # where ask_cancel writes the id of the job it cancels (shared with the worker)
    cancel_slot: protocol.CancelSlot | None = None
    unkillable: frozenset[KillKind] = frozenset()  # kill kinds not sent: a test seam (run/hooks.py)

    @property
    def job(self) -> InFlight | None:
        """The oldest job it runs (the only one, but in a pool with slots), or None."""
        return next(iter(self.running.values()), None)

    @property
    def watched(self) -> bool:
        """Its running jobs are watched (deadline, memory, lease): it is busy, or has slots
        and said Recycling while some still run (a one-slot worker exits at once)."""
        if self.state == WorkerState.BUSY:
            return True
        recycling = self.state == WorkerState.STOPPING and self.recycling
        return recycling and self.slots > 1 and bool(self.running) and self.kill_reason is None

    @property
    def fd(self) -> int:
        return self.sock.fileno()

    @property
    def name(self) -> str:
        return f"{self.pool}#{self.slot}"

    def held(self) -> int:
        """Jobs sent to this worker and not finished: the current one and those queued."""
        return len(self.running) + len(self.queued)

    def jobs(self) -> Iterator[InFlight]:
        """The running jobs, then the queued ones."""
        yield from self.running.values()
        yield from self.queued

    def room(self, depth: int, max_jobs: int | None) -> int:
        """How many more jobs it may be sent: up to ``depth`` held at once, and none past
        its recycle after ``max_jobs`` (those would only come back)."""
        if self.state not in (WorkerState.IDLE, WorkerState.BUSY) or self.kill_reason is not None:
            return 0
        limit = depth if max_jobs is None else min(depth, max_jobs - self.jobs_done)
        return limit - self.held()

    def take(self, job: InFlight, size: int, now: float, timeout: float) -> None:
        """Record a job just sent (``size`` bytes of frame): it runs if a slot is free, else
        it queues."""
        if len(self.running) < self.slots:
            self.start(job, now, timeout)
        else:
            job.deadline = math.inf
            job.size = size
            self.queued.append(job)
            self.queued_bytes += size

    def start(self, job: InFlight, now: float, timeout: float) -> None:
        """``job`` runs, its timeout counted from now."""
        job.started, job.deadline = now, now + timeout
        self.running[job.claimed.job_id] = job
        self.state = WorkerState.BUSY if self.state == WorkerState.IDLE else self.state

    def finished(self, now: float, timeout: float, job_id: int | None = None) -> None:
        """A running job ended (a result, or handed back; ``job_id``, else the oldest): the
        next queued one starts."""
        if job_id is None:
            job_id = next(iter(self.running), None)
        self.running.pop(job_id, None)  # type: ignore[arg-type]
        self.soft_signalled_at = None
        if self.queued:
            job = self.queued.popleft()
            self.queued_bytes -= job.size
            self.start(job, now, timeout)
        elif self.state == WorkerState.BUSY and not self.running:
            self.state = WorkerState.IDLE

    def returned(self, job_id: int, now: float, timeout: float) -> InFlight | None:
        """The worker handed ``job_id`` back unstarted (``Returned``): forget it here."""
        job = self.running.get(job_id)
        if job is not None:
            self.finished(now, timeout, job_id)
            return job
        for job in self.queued:
            if job.claimed.job_id == job_id:
                self.queued.remove(job)
                self.queued_bytes -= job.size
                return job
        return None

    def send(self, msg: protocol.Message, timeout: float = 10.0) -> None:
        """Write one frame (see ``send_bytes``)."""
        self.send_bytes(protocol.encode(msg), timeout)

    def send_bytes(self, frames: bytes, timeout: float = 10.0) -> None:
        """Write encoded frames. The socket's buffer takes a pipeline of small jobs at once,
        so this waits only while a large payload drains; a worker that reads nothing for
        ``timeout`` seconds is broken (``TimeoutError``)."""
        data = memoryview(frames)
        while data:
            try:
                data = data[os.write(self.fd, data) :]
            except BlockingIOError:
                # poll, not select: a supervisor of some 500 workers (two descriptors each)
                # has sockets past FD_SETSIZE
                poller = select.poll()
                poller.register(self.fd, select.POLLOUT)
                if not poller.poll(math.ceil(timeout * 1000)):
                    raise TimeoutError(f"worker {self.name} stopped reading") from None

    def rss(self) -> int | None:
        """Resident set size now (one /proc read, ~7 µs); None once the process is gone."""
        try:
            if self.proc is None:
                self.proc = psutil.Process(self.pid)
            return self.proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def soft_stop(self, now: float) -> None:
        """Ask the running handler to stop (``workers.SoftTimeout``); SIGKILL follows."""
        self.soft_signalled_at = now
        self.soft_target = self.job.claimed.job_id if self.job else None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, protocol.SOFT_TIMEOUT_SIGNAL)

    def ask_cancel(self, job_id: int) -> None:
        """An operator cancelled ``job_id``, the job this worker runs as far as the parent
        knows: write its id to the shared slot, then signal. The worker acts only if that job
        is the one it runs (it may be on the next of a pipeline already): it sets
        ``current_job().cancel_requested`` and SIGTERMs its own group (the job's processes;
        the worker ignores SIGTERM). The caller SIGKILLs the group after a short grace if
        that job still runs."""
        if self.cancel_slot is not None:
            self.cancel_slot.write(job_id)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, protocol.CANCEL_SIGNAL)

    def record_kill(self, reason: KillReason, now: float) -> None:
        """Record why this worker dies, the job that is about (``reason.job_id``, else the one
        it runs now, the oldest) and when: the one place a kill is booked, whether the parent
        kills (``kill``) or the kernel already did (memcg, noticed at reap). The first
        reason sticks: it decides what happens to the jobs (the target's fate; the others
        are released, exits.py)."""
        if self.kill_reason is None:
            self.kill_reason = reason
            target = reason.job_id
            if target is None and self.job is not None:
                target = self.job.claimed.job_id
            self.kill_target = target
            self.killed_at = now
        self.state = WorkerState.STOPPING

    def kill(self, reason: KillReason, now: float) -> None:
        """Book the kill (``record_kill``) and SIGKILL the worker's process group (the job's
        own children die with it)."""
        self.record_kill(reason, now)
        if reason.kind in self.unkillable:
            return  # a test seam (run/hooks.py): a kill that does not work (D state)
        for target in (
            lambda: os.killpg(self.pid, signal.SIGKILL),
            lambda: os.kill(self.pid, signal.SIGKILL),
        ):
            try:
                target()
                return
            except (ProcessLookupError, PermissionError):
                continue


def reap_within(pid: int, timeout: float) -> int | None:
    """Reap our child ``pid``, waiting up to ``timeout`` seconds, then SIGKILL it and reap it.
    Its wait status, or None if it was not our child (reaped already)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            try:
                return os.waitpid(pid, 0)[1]
            except ChildProcessError:
                return None
        time.sleep(0.005)


def fork_paired(buffer: int | None = None) -> tuple[int, socket.socket, socket.socket]:
    """``fork_blocked`` with a socketpair made first, for the parent's end and the child's
    (``buffer``: their send buffer size); both closed if the fork fails."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if buffer is not None:
        for end in (parent_end, child_end):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
    try:
        return fork_blocked(), parent_end, child_end
    except OSError:
        parent_end.close()
        child_end.close()
        raise


def fork_worker(spec: WorkerSpec, *, now: float, child_cleanup: Callable[[], None]) -> WorkerHandle:
    """Fork a worker running ``spec``. ``child_cleanup`` runs first thing in the child and
    closes what it must not keep (the loop, other workers' sockets, listening sockets).

    Signals are blocked across the fork, so none is delivered to the child while it still
    has the parent's handlers; the runtime resets them and unblocks.
    """
    cancel_slot = protocol.CancelSlot()  # before the fork: both sides share it
    pid, parent_end, child_end = fork_paired()
    if pid == 0:  # child
        try:
            parent_end.close()
            child_cleanup()
            os.setpgid(0, 0)  # its own group: a kill reaches the job's subprocesses too
        finally:
            runtime.main(child_end.detach(), spec, cancel_slot)  # never returns
    child_end.close()
    with contextlib.suppress(OSError):  # both sides set it: a kill right after the fork
        os.setpgid(pid, pid)  # finds the group
    parent_end.setblocking(False)
    return WorkerHandle(
        pool=spec.pool,
        slot=spec.slot,
        pid=pid,
        sock=parent_end,
        spawned_at=now,
        cancel_slot=cancel_slot,
        slots=spec.slots,
    )
