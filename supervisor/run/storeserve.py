"""The store process: forked by ``ProcessLink.start`` (supervisor/run/storelink.py), it holds
the database connections and runs the loop's requests one after the other, in order, replying
to each (``link.execute``: a value, a StoreError, or a StoreBug with its traceback logged here).

An ``ArmedClaim`` is held, not answered, until a wake-up (a NOTIFY, SQLite's datagram) names
its pool, or its pool's poll is due, whichever is first; ``Fire`` runs one pool's at once,
``Retime`` brings its deadline forward, ``Disarm`` runs them all (a drain). Wake-ups naming a
pool with no armed claim are forwarded to the loop (request id ``storewire.WAKE``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from supervisor.run import storewire
from supervisor.run.link import Reply, StoreBug, execute
from supervisor.run.requests import ArmedClaim, Disarm, Fire, Request, Retime

if TYPE_CHECKING:
    from supervisor.store import Store

log = logging.getLogger("fleetd.store")

SLOW_CALL = 1.0  # seconds: a call that took longer is logged by the store process
WAKE_EVERY = 0.002  # seconds of calls after which the store process reads its wake-ups

StoreWrapper = Callable[["Store"], "Store"]


def serve(
    sock: socket.socket,
    database: str,
    title: str,
    listen: bool,
    parent: int,
    wrap_store: StoreWrapper | None = None,
) -> int:
    """Run requests in order until the loop's end closes. It dies with the parent
    (PR_SET_PDEATHSIG) and ignores SIGINT/SIGTERM: the parent coordinates shutdown.
    ``wrap_store``: what the requests run against, made of the opened store (a test's seam:
    a verb that fails)."""
    from setproctitle import setproctitle

    from supervisor.store import open_store
    from workers import limits

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    limits.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before PDEATHSIG was set
        return 0
    setproctitle(f"fleetd: store [{title}]")
    opened = open_store(database, migrate=False, bounded=True)  # the parent migrated it
    store = wrap_store(opened) if wrap_store is not None else opened
    waker = _Listener(opened) if listen else None
    armed: dict[str, tuple[int, ArmedClaim, float]] = {}  # pool -> (id, claim, deadline)
    sock.setblocking(True)
    inbox = bytearray()
    chunk = memoryview(bytearray(storewire.CHUNK))
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)

    def run(req_id: int, request: Request[Any]) -> None:
        reply = execute(store, request, time.monotonic)
        took = time.monotonic() - reply.started
        if took > SLOW_CALL:
            log.warning("store call %s took %.1fs", type(request).__name__, took)
        try:
            message = storewire.frame((req_id, reply))
        except Exception as exc:  # a value that does not pickle: fleetd's bug, not an outage
            log.error("store call %s: its reply cannot be sent: %r", type(request).__name__, exc)
            bug = StoreBug(f"{type(request).__name__}: its reply cannot be sent: {exc!r}")
            message = storewire.frame((req_id, Reply(None, bug, reply.started)))
        sock.sendall(message)

    def fire(pool: str) -> None:
        req_id, claim, _ = armed.pop(pool)
        run(req_id, claim)

    drained_at = 0.0

    def take_wakeups() -> None:
        """Run the armed claims of the pools a wake-up names; forward the rest to the loop."""
        nonlocal drained_at
        assert waker is not None
        drained_at = time.monotonic()
        pools = waker.drain(sel)
        forward = pools - armed.keys()  # before firing: a fired pool needs no wake
        for pool in pools & armed.keys():
            fire(pool)  # the claim runs here, a round trip to the loop sooner
        if forward:
            sock.sendall(storewire.frame((storewire.WAKE, forward)))

    try:
        while True:
            if waker is not None:
                waker.register(sel)
            timeout = 1.0 if waker is not None else None
            if armed:
                soonest = min(deadline for _, _, deadline in armed.values())
                timeout = max(0.0, min(timeout or 1.0, soonest - time.monotonic()))
            for key, _ in sel.select(timeout=timeout):
                if key.fileobj is sock and not storewire.receive(sock, inbox, chunk):
                    return 0  # the loop closed its end: done
            if waker is not None:
                take_wakeups()
            now = time.monotonic()
            for pool in [p for p, (_, _, deadline) in armed.items() if deadline <= now]:
                fire(pool)  # its poll is due: claim whether or not a wake-up came
            for req_id, request in storewire.frames(inbox):
                if isinstance(request, ArmedClaim):
                    armed[request.claim.pool] = (req_id, request, time.monotonic() + request.wait)
                    continue
                if isinstance(request, Disarm):  # every armed claim now: answered after them
                    for pool in list(armed):
                        fire(pool)
                elif isinstance(request, Fire) and request.pool in armed:
                    fire(request.pool)
                elif isinstance(request, Retime) and request.pool in armed:
                    held_id, claim, deadline = armed[request.pool]
                    deadline = min(deadline, time.monotonic() + request.wait)
                    armed[request.pool] = (held_id, claim, deadline)
                run(req_id, request)
                if waker is not None and time.monotonic() - drained_at > WAKE_EVERY:
                    # also between calls: SQLite's datagram socket queues ten wake-ups, and
                    # an enqueuer that finds it full drops its own (a poll later)
                    take_wakeups()
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        if waker is not None:
            waker.close()
        opened.close()


class _Listener:
    """The store process's wake-up channel (PostgreSQL's LISTEN connection, SQLite's datagram
    socket: supervisor/store/wake.py), made again when lost."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.waker: Any = None
        self.retry_at = 0.0

    def register(self, sel: selectors.BaseSelector) -> None:
        if self.waker is not None or time.monotonic() < self.retry_at:
            return
        try:
            self.waker = self.store.waker()
        except Exception as exc:
            log.warning("wake-up channel unavailable (%s); polling only", exc)
            self.retry_at = time.monotonic() + 5.0
            return
        sel.register(self.waker.fileno(), selectors.EVENT_READ)

    def drain(self, sel: selectors.BaseSelector) -> set[str]:
        if self.waker is None:
            return set()
        pools = self.waker.drain()
        if self.waker.broken:
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(self.waker.fileno())
            self.close()
            self.retry_at = time.monotonic() + 1.0
        return pools

    def close(self) -> None:
        if self.waker is not None:
            self.waker.close()
            self.waker = None
