"""The forker: a small process that forks every worker, so the supervisor never forks one.

Why it exists. ``fork()`` copies the forking process's page tables, and afterwards every page
the forking process writes while a child still shares it is copied again (copy-on-write). The
supervisor is the largest process of the fleet (its store driver, its view, its metrics) and it
writes all the time, so a pool with a fresh worker per job paid both on the loop's thread for
every job: ~1.5 ms for the fork of a ~45 MiB process and ~700 copy-on-write faults a job in the
loop afterwards (``python -m stress bench-fresh``). The forker does nothing but fork, and it is a
fresh interpreter (``supervisor.run.forklink.start_forker`` spawns ``python -c`` + ``main``
here) that imports this package and the handlers and nothing else: no database driver, no
view, no config models. A worker forked from it copies that much and no more (~18 MiB
resident before the handlers, against ~27 MiB for a forker forked from the supervisor after
it imported the handlers), its exit unmaps as little, and a forker started again after one
died is as small as the first.

What a worker sees is unchanged: it is forked from a process that imported its handlers, and
its parent (the forker) is the pid ``WorkerSpec.parent_pid`` names; PR_SET_PDEATHSIG ties it to
the forker, and the forker's own PR_SET_PDEATHSIG ties the forker to the supervisor, so a
supervisor that is SIGKILLed takes both down. The forker is not a subreaper: what a dead
worker's job left running goes up to the supervisor, which is one (``Children.end_strays``).

The protocol, one ``SOCK_SEQPACKET`` socketpair (each send is one record)::

    supervisor -> forker   pickle(("hello", sys.path, handler table))   first, once
                           pickle(("fork", spec without handlers))
                                       fds: conn, cancel page[, cgroup.procs]
                           pickle(("reaped", pid))     the loop is done with that worker
    forker -> supervisor   pickle(("ready",))   the handlers are imported   or
                           pickle(("broken", message))   they could not be, and it exits
                           pickle(("forked", pid))   or   pickle(("failed", message))
                           pickle(("exit", pid, status))   a worker that ended (any time)

The handler table names each pool's kinds as ``("import", "module:attr")`` (imported here as
the supervisor imported it) or ``("object", handler)`` (one that has no such name, pickled:
a command handler). Fork requests are answered in order, one reply each; ``reaped`` has none.
The supervisor waits for the reply of its request (``supervisor.run.forklink``); exits are
relayed as they happen and the supervisor reads them in its loop.

A worker's pid stays taken until the supervisor says ``reaped``. The forker watches each
worker through a pidfd, relays its end with ``waitid(WNOWAIT)`` and leaves it a zombie; it
reaps it only when the supervisor has read that exit and forgotten the worker. Until then the
supervisor may still signal that pid (a deadline, a drain, a cancel, a memory kill decided a
moment before the end): were the pid free, the kernel could give it to another process, as
soon as its pids wrapped around (``kernel.pid_max`` is 32768 on many hosts). Before it relays
the end of a worker that died abnormally the forker SIGKILLs its process group (the zombie
keeps the group's id reserved), as the supervisor did when it reaped its workers itself. If
the forker dies, the zombies it held are re-parented to the supervisor (a subreaper), which
reaps them with their real status. (``waitid`` on a pidfd needs Linux 5.4; command handlers
use pidfds too.)

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
from typing import Any

from workers import exitcodes, limits, logs, proctitle, protocol, runtime, warmup
from workers.errors import HandlerImportError, one_line
from workers.handlers import Handler, resolve

TITLE = "fleetd: forker"
MAX_RECORD = 1 << 20  # a request: a pickled WorkerSpec without handlers (a few hundred bytes)
MAX_FDS = 4
_CMSG_SPACE = socket.CMSG_LEN(MAX_FDS * 4)
_MSG_CMSG_CLOEXEC = int(socket.MSG_CMSG_CLOEXEC)  # ints: a flag enum's & runs Python code
_MSG_CTRUNC = int(socket.MSG_CTRUNC)


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
        try:  # noqa: SIM105  (no context manager built on the forker's every cycle)
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    blocked = _sigmask(signal.SIG_BLOCK, _ALL_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        _sigmask(signal.SIG_SETMASK, blocked)
        raise
    if pid != 0:
        _sigmask(signal.SIG_SETMASK, blocked)
    return pid


def _recv_cloexec(sock: socket.socket) -> tuple[bytes, list[int], bool]:
    """One record, the fds it carries, and whether some of them were lost (MSG_CTRUNC: this
    process is at its RLIMIT_NOFILE). The fds are close-on-exec from the start: what a job
    execs must not inherit its worker's socket, cancel page or cgroup.procs (SCM_RIGHTS
    gives them without the flag, and ``socket.recv_fds`` drops its ``flags``: CPython
    3.11)."""
    fds = array.array("i")
    data, ancdata, flags, _ = sock.recvmsg(MAX_RECORD, _CMSG_SPACE, _MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), bool(flags & _MSG_CTRUNC)


def ended_abnormally(code: int | None) -> bool:
    """A worker's end from its exit ``code`` (None: killed by a signal): a signal, or a code
    other than a clean stop or a recycle."""
    return code not in (exitcodes.OK, exitcodes.RECYCLE)


def wait_status(si_code: int, si_status: int) -> int:
    """The wait status ``os.waitpid`` would give for a ``waitid`` result that ended a child.

    >>> [wait_status(os.CLD_EXITED, c) for c in (0, 3)]
    [0, 768]
    >>> [wait_status(os.CLD_KILLED, 9), wait_status(os.CLD_DUMPED, 11)]
    [9, 139]
    """
    if si_code == os.CLD_EXITED:
        return (si_status & 0xFF) << 8
    if si_code == os.CLD_DUMPED:
        return si_status | 0x80
    return si_status


HandlerTable = Mapping[str, Mapping[str, tuple[str, Any]]]  # pool -> kind -> how to get it


def main() -> None:
    """The forker process: ``python -c`` runs this with the socket's fd and the supervisor's
    pid as arguments (``supervisor.run.forklink.start_forker``)."""
    code = exitcodes.INTERNAL_ERROR
    try:
        fd, parent = int(sys.argv[1]), int(sys.argv[2])
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(False)  # inherited across the exec; no worker's program keeps it
        code = serve(sock, parent)
    except BaseException:
        import traceback

        if logs.json_lines:  # every line of the fleet's log is one JSON object
            line = logs.json_line("ERROR", "fleetd.forker", "failed", traceback.format_exc())
            os.write(2, (line + "\n").encode("utf-8", "replace"))
        else:
            traceback.print_exc()
    finally:
        os._exit(code)


def load_table(table: HandlerTable) -> dict[str, dict[str, Handler]]:
    """The handlers the hello names: pool -> kind -> handler. Raises ``ImportError`` naming
    the pool, the kind, the spec and the cause."""
    out: dict[str, dict[str, Handler]] = {}
    for pool, kinds in table.items():
        out[pool] = {}
        for kind, (how, what) in kinds.items():
            try:
                out[pool][kind] = resolve(what) if how == "import" else what
            except HandlerImportError as exc:  # named as the supervisor names its own
                raise ImportError(f"pools.{pool}: {exc.with_kind(kind)}") from exc
    return out


def _hello(sock: socket.socket) -> dict[str, dict[str, Handler]] | None:
    """Read the hello, put its sys.path in place and import the handlers; say ``ready``, or
    ``broken`` and None."""
    data, fds, _ = _recv_cloexec(sock)
    for fd in fds:
        os.close(fd)
    try:
        kind, path, table, log = pickle.loads(data)
        if kind != "hello":
            raise ValueError(f"expected a hello, got {kind!r}")
        sys.path[:] = path
        if log is not None:  # before the imports: what they log is formatted too
            logs.setup_logging(log[0], level=log[1])
        handlers = load_table(table)
    except (Exception, SystemExit) as exc:  # an import that raised, or a bad hello
        why = str(exc) if isinstance(exc, ImportError) else one_line(exc)
        with contextlib.suppress(OSError):
            sock.send(_message("broken", f"the forker could not import the handlers: {why}"))
        return None
    sock.send(pickle.dumps(("ready",)))
    return handlers


MESSAGE_AT_MOST = 3000  # bytes of a message record's text (the link reads 64 KiB records)


def _message(tag: str, text: str) -> bytes:
    """A ``broken`` or ``failed`` record, its text cut to ``MESSAGE_AT_MOST`` bytes of UTF-8."""
    raw = text.encode("utf-8", "replace")
    if len(raw) > MESSAGE_AT_MOST:
        text = raw[: MESSAGE_AT_MOST - 20].decode("utf-8", "ignore") + " [cut]"
    return pickle.dumps((tag, text))


def serve(sock: socket.socket, parent: int) -> int:
    """The forker's life: import the handlers the hello names, then fork a worker per
    request until EOF, relaying every exit. Returns the exit code."""
    # dispositions before the mask is cleared: it was spawned with every signal blocked, and a
    # Ctrl-C at the supervisor's terminal reaches this process too
    _signal.signal(signal.SIGINT, _signal.SIG_IGN)  # the supervisor coordinates every stop
    _signal.signal(signal.SIGTERM, _signal.SIG_IGN)
    _signal.signal(signal.SIGCHLD, _signal.SIG_DFL)  # exits come through pidfds
    _sigmask(signal.SIG_SETMASK, ())  # the mask start_forker spawned it with
    proctitle.set_title(TITLE)
    limits.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # the supervisor died before PDEATHSIG was in place
        return exitcodes.PARENT_GONE
    handlers = _hello(sock)
    if handlers is None:
        return exitcodes.SETUP_FAILED
    # a handler module may have installed its own for these at import: the forker's stand
    # (the supervisor coordinates every stop; exits come through pidfds, and a SIGCHLD
    # ignored would reap the workers before their exits are read)
    _signal.signal(signal.SIGINT, _signal.SIG_IGN)
    _signal.signal(signal.SIGTERM, _signal.SIG_IGN)
    _signal.signal(signal.SIGCHLD, _signal.SIG_DFL)
    warmup.prepare_forker()  # after the imports: what a worker needs, done here once
    forker = _Forker(sock, handlers)
    try:
        forker.run()
    finally:
        forker.stop()
    return exitcodes.OK


class _Forker:
    """The forker's loop. Every page it writes while a worker still shares it is copied
    first (a copy-on-write fault, ~2.7 µs), and with two workers alive that is every page it
    touches, every cycle: so the loop builds nothing it can do without (no ``replace``, no
    ``contextlib.suppress``, no flag enums), ~175 faults a fork cycle where it took ~220
    (counted from /proc/<pid>/stat during ``python -m stress bench-fresh``)."""

    def __init__(self, sock: socket.socket, handlers: Mapping[str, Mapping[str, Handler]]) -> None:
        self.sock = sock
        self.handlers = handlers
        self.outbox: deque[bytes] = deque()  # records the socket did not take yet
        # every worker not reaped yet: pid -> its pidfd, until the supervisor says "reaped"
        self.children: dict[int, int] = {}
        self.running: dict[int, int] = {}  # pidfd -> pid, of those whose end is not relayed
        self.poller = select.poll()
        self.pid = os.getpid()
        sock.setblocking(False)

    def run(self) -> None:
        self.poller.register(self.sock.fileno(), select.POLLIN)
        while True:
            waiting = select.POLLOUT if self.outbox else 0
            self.poller.modify(self.sock.fileno(), select.POLLIN | waiting)
            for fd, events in self.poller.poll():
                if fd in self.running:
                    self.ended(fd)
                elif fd != self.sock.fileno():
                    continue  # a pidfd closed by a request handled in this same batch
                elif events & select.POLLIN:
                    if not self.take_requests():
                        return
                elif events & (select.POLLHUP | select.POLLERR):
                    return
            self.flush()

    def take_requests(self) -> bool:
        """Act on every request waiting; False on EOF."""
        while True:
            try:
                data, fds, truncated = _recv_cloexec(self.sock)
            except BlockingIOError:
                return True
            except ConnectionError:
                return False
            if not data:
                for fd in fds:
                    os.close(fd)
                return False
            try:
                kind, arg = pickle.loads(data)
            except Exception as exc:
                kind, arg = "bad", exc
            if kind == "fork" and not truncated:
                self.send(self.fork(arg, fds))
                continue
            for fd in fds:  # only a fork request carries any
                os.close(fd)
            if kind == "fork":  # a worker without its cgroup.procs would escape its limit
                self.send(("failed", "out of descriptors: the request's were not all received"))
            elif kind == "reaped":
                self.reap(arg)
            else:
                self.send(("failed", f"not a request: {arg!r}"))

    def fork(self, spec: Any, fds: list[int]) -> tuple[Any, ...]:
        """One request: fork the worker ``spec`` describes; the reply."""
        try:
            conn, cancel, *cgroup = fds
            # the unpickled spec is this request's own: filled in place (``replace`` would
            # build and check another, in the forker's every cycle)
            vars(spec).update(
                handlers=self.handlers[spec.pool],
                parent_pid=self.pid,
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
                # not .close(): Python code the forker never runs (cold, so faults); the
                # object is never used again in this process, which ends in os._exit
                os.close(self.sock.fileno())
                for pidfd in self.children.values():  # its siblings' (close-on-exec only)
                    os.close(pidfd)
                os.setpgid(0, 0)  # its own group: a kill reaches the job's subprocesses too
                slot = protocol.CancelSlot.adopt(cancel)
            finally:
                runtime.main(conn, spec, slot)  # never returns
        try:  # noqa: SIM105  both sides set it: a kill right after the fork finds the group
            os.setpgid(pid, pid)
        except OSError:
            pass
        for fd in fds:
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:  # EMFILE: a worker it cannot watch is not one to keep
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return ("failed", f"pidfd_open: {exc}")
        self.children[pid] = pidfd
        self.running[pidfd] = pid
        self.poller.register(pidfd, select.POLLIN)
        return ("forked", pid)

    def ended(self, pidfd: int) -> None:
        """A worker's pidfd is readable: relay its end, and keep it a zombie (``reap``)."""
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None:
            return  # not ended after all
        pid = self.running.pop(pidfd)
        self.poller.unregister(pidfd)
        if ended_abnormally(info.si_status if info.si_code == os.CLD_EXITED else None):
            # what its job started dies with it (a crash, its deadline alarm, a kill);
            # a clean exit keeps its helpers (multiprocessing's resource tracker
            # unlinks what the job left in /dev/shm once the worker is gone)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.send(("exit", pid, wait_status(info.si_code, info.si_status)))

    def reap(self, pid: int) -> None:
        """The supervisor is done with ``pid``: reap it, and its pid may be used again."""
        pidfd = self.children.get(pid)
        if pidfd is None or pidfd in self.running:
            return  # not ours, or still running: the supervisor frees only what ended
        del self.children[pid]
        try:  # noqa: SIM105
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        except ChildProcessError:
            pass
        os.close(pidfd)

    def send(self, record: tuple[Any, ...]) -> None:
        failed = record[0] == "failed"  # a message of any length: capped
        self.outbox.append(_message(*record) if failed else pickle.dumps(record))
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
        for pidfd in self.children.values():
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
            os.close(pidfd)
        self.children.clear()
        self.sock.setblocking(True)
        self.sock.settimeout(1.0)
        with contextlib.suppress(OSError):
            for record in self.outbox:
                self.sock.send(record)
