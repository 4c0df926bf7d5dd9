"""``WorkerHandle``: the parent's view of one forked worker, and ``fork_worker``.

A worker is a forked child running ``workers.runtime.main`` on one end of a socketpair. The
parent writes ``RunJob`` frames and reads results from the other end, non-blocking, through the
loop. States::

    starting ──Ready──> idle ──RunJob──> busy ──JobDone/JobFailed──> idle
        │                 │                │
        └─────────────────┴──── exit ──────┴──> gone (reaped; the pool decides on a new one)

Every field is owned by the supervisor's main thread.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from supervisor.model import Claimed
from supervisor.policy import KillReason
from workers import protocol, runtime
from workers.runtime import WorkerSpec


@dataclass
class InFlight:
    """A job sent to a worker. Times are monotonic seconds."""

    claimed: Claimed
    started: float
    deadline: float  # wall-clock timeout, as a monotonic instant
    lease_expires: float  # when our lease runs out unless extended (monotonic)
    extensions: int = 0
    started_ack: bool = False  # the worker said Started: the handler was called


@dataclass
class WorkerHandle:
    pool: str
    slot: int
    pid: int
    sock: socket.socket
    spawned_at: float
    state: str = "starting"  # starting, idle, busy, stopping
    job: InFlight | None = None
    kill_reason: KillReason | None = None
    soft_signalled_at: float | None = None  # SoftTimeout sent to the running job
    killed_at: float | None = None
    last_rss: int | None = None
    jobs_done: int = 0
    reader: protocol.FrameReader = field(default_factory=protocol.FrameReader)
    proc: psutil.Process | None = None

    @property
    def fd(self) -> int:
        return self.sock.fileno()

    @property
    def name(self) -> str:
        return f"{self.pool}#{self.slot}"

    def send(self, msg: protocol.Message, timeout: float = 10.0) -> None:
        """Write one frame. A worker is only sent a job when it is idle and reading, so this
        waits only while a large payload drains; a worker that reads nothing for ``timeout``
        seconds is broken (``TimeoutError``)."""
        data = memoryview(protocol.encode(msg))
        while data:
            try:
                data = data[os.write(self.fd, data) :]
            except BlockingIOError:
                _, writable, _ = select.select([], [self.fd], [], timeout)
                if not writable:
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
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, protocol.SOFT_TIMEOUT_SIGNAL)

    def kill(self, reason: KillReason, now: float) -> None:
        """SIGKILL the worker's process group (the job's own children die with it). The
        first reason sticks: it decides what happens to the job."""
        if self.kill_reason is None:
            self.kill_reason = reason
            self.killed_at = now
        self.state = "stopping"
        if reason.kind in os.environ.get("FLEETD_TEST_NO_KILL", "").split(","):
            return  # test-only: simulate a kill that does not work (a process in D state)
        for target in (
            lambda: os.killpg(self.pid, signal.SIGKILL),
            lambda: os.kill(self.pid, signal.SIGKILL),
        ):
            try:
                target()
                return
            except (ProcessLookupError, PermissionError):
                continue


def fork_worker(spec: WorkerSpec, *, now: float, child_cleanup: Callable[[], None]) -> WorkerHandle:
    """Fork a worker running ``spec``. ``child_cleanup`` runs first thing in the child and
    closes what it must not keep (the loop, other workers' sockets, listening sockets).

    Signals are blocked across the fork, so none is delivered to the child while it still
    has the parent's handlers; the runtime resets them and unblocks.
    """
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the child would flush the parent's buffered output again
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        parent_end.close()
        child_end.close()
        raise
    if pid == 0:  # child
        try:
            parent_end.close()
            child_cleanup()
            os.setpgid(0, 0)  # its own group: a kill reaches the job's subprocesses too
        finally:
            runtime.main(child_end.detach(), spec)  # never returns
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    child_end.close()
    with contextlib.suppress(OSError):  # both sides set it: a kill right after the fork
        os.setpgid(pid, pid)  # finds the group
    parent_end.setblocking(False)
    return WorkerHandle(pool=spec.pool, slot=spec.slot, pid=pid, sock=parent_end, spawned_at=now)
