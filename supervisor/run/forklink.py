"""``ForkLink``: the supervisor's end of its forker (workers/forker.py says why there is one).

``start_forker`` spawns the forker (a fresh interpreter that imports only the workers package
and the handlers; it says ``ready`` once they are imported); ``ForkLink.fork_worker`` asks it
for a worker and returns
the same ``WorkerHandle`` an in-process fork did. The request is answered as soon as the
forker's ``fork()`` returns (the child boots on its own meanwhile): the loop waits for that
answer as it waited for its own ``fork()`` before, up to ``REPLY_LIMIT``; a forker that does not
answer by then is broken (``ForkerGone``: the fleet kills it and starts another). Exits come
later, whenever a worker ends: the loop watches ``fileno()`` and takes them with
``take_exits``, and says ``reaped`` once it has forgotten the worker; only then does the forker
reap it, so the pid names no other process while the loop may still signal it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import workers
from supervisor.run.exits import describe_status
from supervisor.run.workerproc import WorkerHandle, reap_within
from workers import protocol
from workers.errors import HandlerImportError
from workers.forker import HandlerTable
from workers.handlers import Handler, resolve
from workers.logs import JsonFormatter
from workers.runtime import WorkerSpec

REPLY_LIMIT = 2.0  # seconds a fork request may take; a fork is ~1 ms
# seconds a new forker may take to import the handlers before it counts as hung (the
# supervisor imported the same modules already; a heavy one, a model, takes seconds)
BOOT_LIMIT = 60.0
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(workers.__file__)))
_BOOT = f"import sys; sys.path.insert(0, {_ROOT!r}); from workers.forker import main; main()"
# the largest hello a SOCK_SEQPACKET record carries here (the default socket buffer)
HELLO_AT_MOST = 200_000
_RECORD = 65536  # the forker's records: a tuple of a few ints or a message (capped there)


class ForkFailed(Exception):
    """This worker could not be forked: ``fork()`` failed in the forker (EAGAIN, ENOMEM), or
    its socket or cancel page could not be made here (EMFILE)."""


class ForkerGone(Exception):
    """The forker is dead, closed its end, or did not answer in time."""


def start_forker(
    handlers: Mapping[str, Mapping[str, Handler]],
    refs: Mapping[str, Mapping[str, str]] | None = None,
    *,
    boot_limit: float = BOOT_LIMIT,
) -> ForkLink:
    """Spawn the forker (``handlers``: pool -> kind -> handler, imported here already; they
    are what its workers run). It imports each by a name that gives this very object: the
    ``"module:attr"`` of ``refs`` (the config's), else its ``module:qualname``; one with no
    such name (a command handler) is pickled. It sets up logging as this process's root
    logger is (a handler's log lines look like the supervisor's). ``boot_limit``: seconds it
    may take to say ``ready``. Raises ``ValueError`` for a handler that has neither name nor
    pickle, ``OSError`` if the process cannot be started."""
    hello = pickle.dumps(("hello", list(sys.path), handler_table(handlers, refs), log_settings()))
    if len(hello) > HELLO_AT_MOST:
        raise ValueError(
            f"the handlers' table is {len(hello):,} bytes pickled, more than the forker's "
            f"hello carries ({HELLO_AT_MOST:,}): name the handlers in fleet.toml"
        )
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        child_end.set_inheritable(True)  # the one descriptor it keeps across the exec
        argv = [
            sys.executable,
            *subprocess._args_from_interpreter_flags(),  # -X, -W, -O as this process runs
            # -u is not among those (PYTHONUNBUFFERED is, through the environment)
            *(["-u"] if getattr(sys.stdout, "write_through", False) else []),
            # no working folder on sys.path: a pickle.py there must not shadow the standard
            # library before the hello puts the supervisor's sys.path in place
            "-P",
            "-c",
            _BOOT,
            str(child_end.fileno()),
            str(os.getpid()),
        ]
        # every signal blocked until it has set its dispositions (a Ctrl-C at the terminal
        # reaches it too; the supervisor coordinates every stop)
        pid = os.posix_spawn(sys.executable, argv, os.environ, setsigmask=_ALL_SIGNALS)
    except BaseException:
        parent_end.close()
        raise
    finally:
        child_end.close()
    link = ForkLink(pid, parent_end, boot_limit)
    try:
        parent_end.sendall(hello)  # blocking: a large one waits for the forker to read it
    except OSError as exc:
        link.close_socket()
        link.wait(1.0)
        raise OSError(exc.errno, f"the forker did not take its hello: {exc}") from exc
    parent_end.setblocking(False)
    return link


_ALL_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}


def log_settings() -> tuple[str, int] | None:
    """This process's log format and level, for the forker to set up the same (None: the
    root logger has no handler here, so the forker sets none up either)."""
    root = logging.getLogger()
    if not root.handlers:
        return None
    json_lines = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    return ("json" if json_lines else "human", root.level)


def handler_table(
    handlers: Mapping[str, Mapping[str, Handler]],
    refs: Mapping[str, Mapping[str, str]] | None = None,
) -> HandlerTable:
    """How the forker gets each handler (workers/forker.py): by a name that resolves to this
    very object, else the object itself, pickled (checked here: ``ValueError``)."""
    table: dict[str, dict[str, tuple[str, Any]]] = {}
    for pool, kinds in handlers.items():
        table[pool] = {}
        for kind, handler in kinds.items():
            names = [(refs or {}).get(pool, {}).get(kind), _qualified_name(handler)]
            name = next((n for n in names if n is not None and _names(n, handler)), None)
            if name is not None:
                table[pool][kind] = ("import", name)
                continue
            if getattr(handler, "__module__", None) == "__main__":
                raise ValueError(
                    f"pools.{pool}: handler {kind!r} is defined in __main__, which the forker "
                    "cannot import: define it in a module"
                )
            try:
                pickle.dumps(handler)
            except Exception as exc:
                raise ValueError(
                    f"pools.{pool}: handler {kind!r} ({handler!r}) can be neither imported by "
                    f"name nor pickled for the forker: {exc}"
                ) from exc
            table[pool][kind] = ("object", handler)
    return table


def _qualified_name(handler: Handler) -> str | None:
    module, qualname = getattr(handler, "__module__", None), getattr(handler, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    if module == "__main__":  # the forker's __main__ is its own
        return None
    return f"{module}:{qualname}"


def _names(name: str, handler: Handler) -> bool:
    """Whether importing ``name`` gives ``handler`` itself (its module is imported already)."""
    try:
        return resolve(name) is handler
    except HandlerImportError:
        return False


class ForkLink:
    def __init__(self, pid: int, sock: socket.socket, boot_limit: float = BOOT_LIMIT) -> None:
        self.pid: int | None = pid  # None once reaped
        self.sock: socket.socket | None = sock
        self.exits: list[tuple[int, int]] = []  # relayed, not taken yet: (pid, wait status)
        self.unsent: deque[bytes] = deque()  # "reaped" records the socket did not take yet
        self.started_at = time.monotonic()
        self.ready = False  # it said it imported the handlers; forks are asked for only then
        self.boot_limit = boot_limit  # seconds it may take to say so
        self.broken: str | None = None  # why it could not, as it said

    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock is not None else None

    def fork_worker(
        self, spec: WorkerSpec, *, now: float, cgroup_fd: int | None = None
    ) -> WorkerHandle:
        """Ask for a worker running ``spec`` (its handlers are the forker's own, by pool);
        ``cgroup_fd``: the ``cgroup.procs`` fd it joins first (the caller keeps and closes
        its own copy). Raises ``ForkFailed`` or ``ForkerGone``."""
        if self.sock is None:
            raise ForkerGone(self.broken or "the forker is gone")
        if not self.ready:
            self.await_ready(self.boot_limit)
        try:  # out of descriptors (EMFILE) or memory: this fork fails, the loop goes on
            cancel_slot, cancel_fd = protocol.CancelSlot.shared()
        except OSError as exc:
            raise ForkFailed(f"no cancel page for the worker: {exc}") from exc
        try:
            parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            cancel_slot.close()
            os.close(cancel_fd)
            raise ForkFailed(f"no socket for the worker: {exc}") from exc
        try:
            request = pickle.dumps(("fork", replace(spec, handlers={}, cgroup_fd=None)))
            fds = [child_end.fileno(), cancel_fd]
            if cgroup_fd is not None:
                fds.append(cgroup_fd)
            try:
                self._flush()
                socket.send_fds(self.sock, [request], fds)
            except BlockingIOError:  # never with one request at a time, but not a hang
                raise ForkerGone("the forker's socket is full") from None
            except OSError as exc:
                raise ForkerGone(f"the forker's socket: {exc}") from exc
            reply = self._reply()
        except BaseException:
            cancel_slot.close()
            parent_end.close()
            raise
        finally:
            child_end.close()
            os.close(cancel_fd)
        if reply[0] != "forked":
            cancel_slot.close()
            parent_end.close()
            raise ForkFailed(str(reply[1]))
        parent_end.setblocking(False)
        return WorkerHandle(
            pool=spec.pool,
            slot=spec.slot,
            pid=reply[1],
            sock=parent_end,
            spawned_at=now,
            cancel_slot=cancel_slot,
            slots=spec.slots,
        )

    def await_ready(self, timeout: float) -> None:
        """Block until the forker has imported the handlers; ``ForkerGone`` if it could not,
        died, or took longer than ``timeout``. (The fleet does not block: it forks only once
        ``ready`` is set, by ``take_exits`` reading the forker's ``ready``.)"""
        assert self.sock is not None
        deadline = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while not self.ready:
            try:
                self._read()
            except ForkerGone:
                if self.broken is not None:
                    raise
                status = self.wait(1.0)  # it died before it could say why: its stderr did
                ended = describe_status(status) if status is not None else "gone"
                raise ForkerGone(
                    f"the forker ended before it was ready ({ended}); its stderr says why"
                ) from None
            left = deadline - time.monotonic()
            if self.ready:
                return
            if left <= 0:
                raise ForkerGone(f"the forker did not import the handlers in {timeout:g}s")
            poller.poll(math.ceil(left * 1000))

    def _reply(self) -> tuple[Any, ...]:
        """The answer to the request just sent; exits read meanwhile are kept."""
        assert self.sock is not None
        deadline = time.monotonic() + REPLY_LIMIT
        # poll, not select: a forker started again by a supervisor holding a thousand
        # descriptors has one past FD_SETSIZE
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while True:
            replies = self._read()  # exits may come before and after the reply
            if replies:
                return replies[0]
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkerGone(f"the forker did not answer a fork request in {REPLY_LIMIT:g}s")
            poller.poll(math.ceil(left * 1000))

    def _read(self) -> list[tuple[Any, ...]]:
        """Every record waiting, without blocking: exits go to ``exits``, the rest (replies)
        are returned. ``ForkerGone`` on EOF, once what came before it is kept."""
        assert self.sock is not None
        replies = []
        while True:
            try:
                data = self.sock.recv(_RECORD)
            except BlockingIOError:
                return replies
            except OSError as exc:
                raise ForkerGone(f"the forker's socket: {exc}") from exc
            if not data:
                raise ForkerGone("the forker closed its end")
            try:
                record = pickle.loads(data)
                tag = record[0]
            except Exception as exc:  # cut short, or not ours: nothing more can be believed
                raise ForkerGone(f"the forker sent a record that does not read: {exc}") from exc
            if tag == "exit":
                self.exits.append((record[1], record[2]))
            elif tag == "ready":
                self.ready = True
            elif tag == "broken":
                self.broken = str(record[1])
                raise ForkerGone(self.broken)
            else:
                replies.append(record)

    def take_exits(self) -> list[tuple[int, int]]:
        """The workers that ended since the last call: (pid, wait status), in order,
        including those relayed just before the forker died. Once the forker closed its
        end, ``gone`` is True (and the socket closed)."""
        if self.sock is not None:
            try:
                self._read()
                self._flush()
            except ForkerGone:
                self.close_socket()
        exits, self.exits = self.exits, []
        return exits

    def reaped(self, pid: int) -> None:
        """The loop has taken worker ``pid``'s exit and forgotten it: the forker may reap it
        (until then it stays a zombie, its pid taken) and the pid be used again."""
        self.unsent.append(pickle.dumps(("reaped", pid)))
        self._flush()

    def _flush(self) -> None:
        """Send the ``reaped`` records waiting (a full socket keeps them for the next call;
        a broken one drops them: the forker is gone, and so are its zombies)."""
        while self.unsent and self.sock is not None:
            try:
                self.sock.send(self.unsent[0])
            except BlockingIOError:
                return
            except OSError:
                self.unsent.clear()
                return
            self.unsent.popleft()

    @property
    def gone(self) -> bool:
        """Its end is closed: the forker died, or was told to stop."""
        return self.sock is None

    def close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def close(self, timeout: float) -> int | None:
        """Stop the forker: it kills what workers are left, reaps them and exits (their exits
        are not read any more). Reaped here; SIGKILL after ``timeout``. Its wait status, or
        None if it was reaped already."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
        self.close_socket()
        return self.wait(timeout)

    def wait(self, timeout: float) -> int | None:
        """Reap the forker, which is stopping or was killed (SIGKILL after ``timeout``); its
        socket stays open, so what it relayed before it died can still be read. Its wait
        status, or None if it was reaped already."""
        if self.pid is None:
            return None
        pid, self.pid = self.pid, None
        return reap_within(pid, timeout)
