"""``ForkLink``: the supervisor's end of its forker (workers/forker.py says why there is one).

``start_forker`` forks the forker; ``ForkLink.fork_worker`` asks it for a worker and returns
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
import math
import os
import pickle
import select
import socket
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from supervisor.run.workerproc import WorkerHandle, reap_within
from workers import exitcodes, forker, protocol
from workers.handlers import Handler
from workers.runtime import WorkerSpec

REPLY_LIMIT = 2.0  # seconds a fork request may take; a fork is ~1 ms
_RECORD = 4096  # the forker's records are a pickled tuple of a few ints or a short message


class ForkFailed(Exception):
    """This worker could not be forked: ``fork()`` failed in the forker (EAGAIN, ENOMEM), or
    its socket or cancel page could not be made here (EMFILE)."""


class ForkerGone(Exception):
    """The forker is dead, closed its end, or did not answer in time."""


def start_forker(
    handlers: Mapping[str, Mapping[str, Handler]],
    child_cleanup: Callable[[], None] | None = None,
) -> ForkLink:
    """Fork the forker from this process (``handlers``: pool -> kind -> handler, imported
    already; they are what its workers run). ``child_cleanup`` runs first in it and closes
    what it must not keep."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    try:
        pid = forker.fork_blocked()
    except OSError:
        parent_end.close()
        child_end.close()
        raise
    if pid == 0:
        code = exitcodes.INTERNAL_ERROR
        try:
            parent_end.close()
            if child_cleanup is not None:
                child_cleanup()
            code = forker.serve(child_end, handlers, parent)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    child_end.close()
    parent_end.setblocking(False)
    return ForkLink(pid, parent_end)


class ForkLink:
    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid: int | None = pid  # None once reaped
        self.sock: socket.socket | None = sock
        self.exits: list[tuple[int, int]] = []  # relayed, not taken yet: (pid, wait status)
        self.unsent: deque[bytes] = deque()  # "reaped" records the socket did not take yet
        self.started_at = time.monotonic()

    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock is not None else None

    def fork_worker(
        self, spec: WorkerSpec, *, now: float, cgroup_fd: int | None = None
    ) -> WorkerHandle:
        """Ask for a worker running ``spec`` (its handlers are the forker's own, by pool);
        ``cgroup_fd``: the ``cgroup.procs`` fd it joins first (the caller keeps and closes
        its own copy). Raises ``ForkFailed`` or ``ForkerGone``."""
        if self.sock is None:
            raise ForkerGone("the forker is gone")
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
            record = pickle.loads(data)
            if record[0] == "exit":
                self.exits.append((record[1], record[2]))
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
