"""The forker: a small process that forks every worker, so the supervisor never forks one.

Why it exists. ``fork()`` copies the forking process's page tables, and afterwards every page
the forking process writes while a child still shares it is copied again (copy-on-write). The
supervisor is the largest process of the fleet (its store driver, its view, its metrics) and it
writes all the time, so a pool with a fresh worker per job paid both on the loop's thread for
every job: ~1.5 ms for the fork of a ~45 MiB process and ~700 copy-on-write faults a job in the
loop afterwards (``python -m stress bench-fresh``). The forker is forked from the supervisor at
start, once the handlers are imported and before the supervisor imports its database driver
(supervisor/run/boot.py), and then does nothing but fork: a smaller process to copy, and one
that writes almost nothing between forks.

What a worker sees is unchanged: it is forked from a process that imported its handlers, and
its parent (the forker) is the pid ``WorkerSpec.parent_pid`` names; PR_SET_PDEATHSIG ties it to
the forker, and the forker's own PR_SET_PDEATHSIG ties the forker to the supervisor, so a
supervisor that is SIGKILLed takes both down. The forker is not a subreaper: what a dead
worker's job left running goes up to the supervisor, which is one (``Fleet.end_strays``).

The protocol, one ``SOCK_SEQPACKET`` socketpair (each send is one record)::

    supervisor -> forker   pickle((spec without handlers,))   fds: conn, cancel page[, cgroup.procs]
    forker -> supervisor   pickle(("forked", pid))   or   pickle(("failed", message))
                           pickle(("exit", pid, status))      a worker it reaped (any time)

Requests are answered in order, one reply each. The supervisor waits for the reply of its
request (``supervisor.run.forklink``); exits are relayed as they happen and the supervisor
reads them in its loop. Before reaping a worker that died abnormally the forker SIGKILLs its
process group (the zombie keeps the group's id reserved until then), as the supervisor did
when it reaped its workers itself.

On EOF from the supervisor (it stopped, or died) the forker SIGKILLs every worker left, reaps
them, and exits.
"""

from __future__ import annotations

import _signal
import array
import contextlib
import os
import pickle
import select
import signal
import socket
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from workers import exitcodes, limits, proctitle, protocol, runtime
from workers.handlers import Handler

TITLE = "fleetd: forker"
MAX_RECORD = 1 << 20  # a request: a pickled WorkerSpec without handlers (a few hundred bytes)
MAX_FDS = 4


# signal.pthread_sigmask turns the mask it returns into Signals members (~0.6 ms a fork,
# measured: 65 enum lookups twice); the C function underneath returns plain ints.
_sigmask = getattr(_signal, "pthread_sigmask", signal.pthread_sigmask)
_ALL_SIGNALS = frozenset(int(s) for s in signal.valid_signals())


def fork_blocked() -> int:
    """``os.fork()`` with every signal blocked across it and stdout and stderr flushed first:
    no signal reaches the child while it still has the parent's handlers (the child unblocks
    what it wants), and the child never writes the parent's buffered output again. The
    parent's mask is restored, also when the fork fails."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    blocked = _sigmask(signal.SIG_BLOCK, _ALL_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        _sigmask(signal.SIG_SETMASK, blocked)
        raise
    if pid != 0:
        _sigmask(signal.SIG_SETMASK, blocked)
    return pid


def _recv_cloexec(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One record and the fds it carries, close-on-exec from the start: what a job execs
    must not inherit its worker's socket, cancel page or cgroup.procs (SCM_RIGHTS gives them
    without the flag, and ``socket.recv_fds`` drops its ``flags``: CPython 3.11)."""
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(
        MAX_RECORD, socket.CMSG_LEN(MAX_FDS * fds.itemsize), socket.MSG_CMSG_CLOEXEC
    )
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def ended_abnormally(code: int | None) -> bool:
    """A worker's end from its exit ``code`` (None: killed by a signal): a signal, or a code
    other than a clean stop or a recycle."""
    return code not in (exitcodes.OK, exitcodes.RECYCLE)


def serve(sock: socket.socket, handlers: Mapping[str, Mapping[str, Handler]], parent: int) -> int:
    """The forker's life, in the child of ``supervisor.run.forklink.start_forker``: fork a
    worker per request until EOF, relaying every exit. Returns the exit code."""
    proctitle.set_title(TITLE)
    _sigmask(signal.SIG_SETMASK, ())  # fork_blocked's mask, inherited
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor coordinates every stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    limits.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # the supervisor died before PDEATHSIG was in place
        return exitcodes.PARENT_GONE
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd is what matters
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    forker = _Forker(sock, handlers, (wake_r, wake_w))
    try:
        forker.run()
    finally:
        forker.stop()
    return exitcodes.OK


class _Forker:
    def __init__(
        self,
        sock: socket.socket,
        handlers: Mapping[str, Mapping[str, Handler]],
        wake: tuple[int, int],
    ) -> None:
        self.sock = sock
        self.handlers = handlers
        self.wake = wake
        self.outbox: deque[bytes] = deque()  # records the socket did not take yet
        self.children: set[int] = set()
        sock.setblocking(False)

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake[0], select.POLLIN)
        while True:
            waiting = select.POLLOUT if self.outbox else 0
            poller.modify(self.sock.fileno(), select.POLLIN | waiting)
            for fd, events in poller.poll():
                if fd == self.wake[0]:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake[0], 512):
                            pass
                    self.reap()
                elif events & select.POLLIN:
                    if not self.take_requests():
                        return
                elif events & (select.POLLHUP | select.POLLERR):
                    return
            self.reap()  # a SIGCHLD that arrived while forking
            self.flush()

    def take_requests(self) -> bool:
        """Fork for every request waiting; False on EOF."""
        while True:
            try:
                data, fds = _recv_cloexec(self.sock)
            except BlockingIOError:
                return True
            except ConnectionError:
                return False
            if not data:
                for fd in fds:
                    os.close(fd)
                return False
            self.send(self.fork(data, fds))

    def fork(self, data: bytes, fds: list[int]) -> tuple[Any, ...]:
        """One request: fork the worker it describes; the reply."""
        try:
            (spec,) = pickle.loads(data)
            conn, cancel, *cgroup = fds
            spec = replace(
                spec,
                handlers=self.handlers[spec.pool],
                parent_pid=os.getpid(),
                cgroup_fd=cgroup[0] if cgroup else None,
            )
            pid = fork_blocked()
        except Exception as exc:  # a bad request or a failed fork: the supervisor decides
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return ("failed", f"{type(exc).__name__}: {exc}")
        if pid == 0:  # the worker
            slot = None
            try:
                self.sock.close()
                for fd in self.wake:
                    os.close(fd)
                os.setpgid(0, 0)  # its own group: a kill reaches the job's subprocesses too
                slot = protocol.CancelSlot.adopt(cancel)
            finally:
                runtime.main(conn, spec, slot)  # never returns
        self.children.add(pid)
        with contextlib.suppress(OSError):  # both sides set it: a kill right after the fork
            os.setpgid(pid, pid)  # finds the group
        for fd in fds:
            os.close(fd)
        return ("forked", pid)

    def reap(self) -> None:
        while True:
            try:  # look first (WNOWAIT): the zombie keeps its process group's id reserved
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            if ended_abnormally(info.si_status if info.si_code == os.CLD_EXITED else None):
                # what its job started dies with it (a crash, its deadline alarm, a kill);
                # a clean exit keeps its helpers (multiprocessing's resource tracker
                # unlinks what the job left in /dev/shm once the worker is gone)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(info.si_pid, signal.SIGKILL)
            pid, status = os.waitpid(info.si_pid, 0)
            self.children.discard(pid)
            self.send(("exit", pid, status))

    def send(self, record: tuple[Any, ...]) -> None:
        self.outbox.append(pickle.dumps(record))
        self.flush()

    def flush(self) -> None:
        while self.outbox:
            try:
                self.sock.send(self.outbox[0])
            except BlockingIOError:
                return
            except OSError:  # the supervisor is gone: EOF ends the loop
                self.outbox.clear()
                return
            self.outbox.popleft()

    def stop(self) -> None:
        """The supervisor is gone or done: no worker outlives the forker."""
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.sock.setblocking(True)
        self.sock.settimeout(1.0)
        with contextlib.suppress(OSError):
            for record in self.outbox:
                self.sock.send(record)
