"""How the supervisor's loop uses the store without ever waiting for it: the two ``Link``s
(supervisor/run/link.py).

    loop (parent) ──submit(request, on_reply)──> socket ──> store process: open_store(url)
         ^                                                        │ runs calls in order, one
         └──── on_reply(Reply) ── selector callback <── socket <──┘ at a time; wake-ups too

Every store call of the running supervisor goes through a link. ``ProcessLink`` hands it to a
process of the supervisor's own, forked at boot (supervisor/run/storeserve.py), which holds the
database connections and runs the calls one after the other; the loop goes on at once and gets
the reply through its selector. However long a call takes (a stalled server, a network
partition, another process holding SQLite's write lock), the loop keeps killing jobs at their
deadline, stopping memory bombs, reaping and forking workers, answering /metrics and /healthz
and acting on signals.
It also moves the SQL's CPU off the loop's thread.

``InlineLink`` runs the same calls in the caller's thread and replies before ``submit``
returns: for tests that drive a fleet step by step, and for nothing else.

What it cannot do: a call the store process had finished when it died (its reply lost) is
reported as failed; if it was a claim, those leases are not known to the loop and expire into
a reaper (the delivery counts). ``CALL_LIMIT`` bounds a call the database never answers: the
store process is then killed and forked again.
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

from supervisor.errors import StoreError, StoreUnavailable
from supervisor.run import storewire
from supervisor.run.link import OnReply, Reply, StoreBug, deliver, execute
from supervisor.run.requests import ArmedClaim, Request
from supervisor.run.storeserve import StoreWrapper, serve
from supervisor.run.workerproc import fork_paired, reap_within

if TYPE_CHECKING:
    from supervisor.store import Store

log = logging.getLogger("fleetd.store")

CALL_LIMIT = 90.0  # seconds a call may stay unanswered before the store process is replaced
RESPAWN_BACKOFF = (0.2, 5.0)  # first and longest wait before forking a dead store process again


class InlineLink:
    """Calls run in the caller's thread, the reply given before ``submit`` returns."""

    def __init__(self, store: Store, monotonic: Callable[[], float]) -> None:
        self.store = store
        self.monotonic = monotonic
        self.on_wake: Callable[[set[str]], None] = lambda pools: None

    arms_claims = False  # a claim never waits for a wake-up inline

    def submit(self, request: Request[Any], on_reply: OnReply) -> None:
        deliver(on_reply, execute(self.store, request, self.monotonic))

    def waiting_since(self) -> float | None:
        return None

    def pending(self) -> int:
        return 0

    def attach(
        self, watch: Callable[[int, Callable[[], None]], None], unwatch: Callable[[int], None]
    ) -> None:
        pass

    def start(self, child_cleanup: Callable[[], None]) -> None:
        pass

    def tick(self, now: float, child_cleanup: Callable[[], None] | None = None) -> None:
        pass

    def wait_idle(self, timeout: float) -> bool:
        return True

    def close(self, timeout: float) -> None:
        pass


class ProcessLink:
    """The loop's end of the store process. Owned by the supervisor's main thread."""

    def __init__(
        self, database: str, *, title: str, listen: bool, wrap_store: StoreWrapper | None = None
    ) -> None:
        self.database = database
        self.title = title
        self.listen = listen  # the store process takes the wake-ups and forwards them
        # what the store process runs requests against, made of the store it opens (None:
        # that store): a test's seam, to make a verb fail in a real store process
        self.wrap_store = wrap_store
        self.on_wake: Callable[[set[str]], None] = lambda pools: None
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.inbox = bytearray()
        self.chunk = memoryview(bytearray(storewire.CHUNK))  # what one read takes
        self.outbox = bytearray()  # frames the kernel did not take yet
        # id -> (request, when it is due, on_reply)
        self.calls: dict[int, tuple[Request[Any], float, OnReply]] = {}
        self.next_id = 0
        self.respawn_at = 0.0
        self.deaths = 0  # in a row, for the backoff
        self.killed = False  # SIGKILL sent for a call past CALL_LIMIT, not reaped yet
        self.watch: Callable[[int, Callable[[], None]], None] | None = None
        self.unwatch: Callable[[int], None] | None = None

    # ---- life ----------------------------------------------------------------------------

    def start(self, child_cleanup: Callable[[], None]) -> None:
        """Fork the store process (signals blocked across the fork, as for workers)."""
        parent = os.getpid()
        pid, parent_end, child_end = fork_paired(buffer=4 << 20)
        if pid == 0:  # the store process
            code = 1
            try:
                parent_end.close()
                child_cleanup()
                code = serve(
                    child_end, self.database, self.title, self.listen, parent, self.wrap_store
                )
            finally:
                os._exit(code)
        child_end.close()
        parent_end.setblocking(False)
        self.pid, self.sock = pid, parent_end
        self.inbox.clear()
        self.outbox.clear()
        if self.watch is not None:
            self.watch(parent_end.fileno(), self.on_readable)

    def attach(
        self, watch: Callable[[int, Callable[[], None]], None], unwatch: Callable[[int], None]
    ) -> None:
        self.watch, self.unwatch = watch, unwatch
        if self.sock is not None:
            watch(self.sock.fileno(), self.on_readable)

    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock is not None else None

    def exited(self, status: int, now: float) -> None:
        """The store process was reaped: the replies it wrote before it died are handled,
        every other call it held failed; another is forked after a backoff."""
        try:
            if self.sock is not None:
                self.on_readable()  # replies already in the socket are replies, not losses
            self._handle_inbox()  # and those read before a failed send disconnected it
        finally:  # also when one of them was a bug (raised into the loop's guard)
            self._disconnect()
            self.pid = None
            self.killed = False
            self.deaths += 1
            low, high = RESPAWN_BACKOFF
            wait = min(high, low * 2 ** (self.deaths - 1))
            self.respawn_at = now + wait
            log.error("store process exited (status %d); a new one in %.1fs", status, wait)
            self._fail_all(StoreUnavailable("the store process exited"))

    def tick(self, now: float, child_cleanup: Callable[[], None] | None = None) -> None:
        """Fork a new store process when due; replace one whose call passed CALL_LIMIT;
        send what the kernel did not take."""
        if self.pid is None:
            if child_cleanup is not None and now >= self.respawn_at:
                self.start(child_cleanup)
            return
        if self.outbox:
            self._send()
        since = self.waiting_since()
        if since is not None and now - since > CALL_LIMIT and not self.killed:
            log.error("store call unanswered for %.0fs: replacing the store process", now - since)
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def close(self, timeout: float) -> None:
        """End the store process: EOF, then wait up to ``timeout``, then SIGKILL."""
        pid = self.pid
        self._disconnect()
        if pid is None:
            return
        reap_within(pid, timeout)
        self.pid = None

    # ---- calls ---------------------------------------------------------------------------

    @property
    def arms_claims(self) -> bool:
        """Whether a claim may wait in the store process for a wake-up (``ArmedClaim``)."""
        return self.listen

    def submit(self, request: Request[Any], on_reply: OnReply) -> None:
        """Send a request; ``on_reply`` runs from the loop when it is answered (with a
        StoreUnavailable error if the store process is not running or dies first; a
        StoreBug is raised after it: ``link.deliver``)."""
        if self.sock is None:
            on_reply(Reply(None, StoreUnavailable("the store process is not running"), 0.0))
            return
        self.next_id += 1
        # an armed claim is due only when its pool's poll is: not a call the store sits on
        wait = request.wait if isinstance(request, ArmedClaim) else 0.0
        self.calls[self.next_id] = (request, time.monotonic() + wait, on_reply)
        self.outbox += storewire.frame((self.next_id, request))
        self._send()

    def pending(self) -> int:
        return len(self.calls)

    def waiting_since(self) -> float | None:
        """When the oldest unanswered call was due (monotonic: when it was sent, or for an
        armed claim, when its pool's poll is), or None."""
        return min((sent for _, sent, _ in self.calls.values()), default=None)

    def wait_idle(self, timeout: float) -> bool:
        """Block until every call is answered or ``timeout`` passes (only when nothing else
        needs the loop: an emergency stop, the node's last row at shutdown)."""
        deadline = time.monotonic() + timeout
        self._handle_inbox()  # replies read before a callback raised
        while self.calls and self.sock is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._send()
            with selectors.DefaultSelector() as sel:
                sel.register(self.sock, selectors.EVENT_READ)
                if sel.select(min(left, 0.05)):
                    self.on_readable()
        return not self.calls

    def on_readable(self) -> None:
        assert self.sock is not None
        try:
            while True:
                if not storewire.receive(self.sock, self.inbox, self.chunk):
                    self._disconnect()  # it is exiting; its status comes with SIGCHLD
                    break
        except BlockingIOError:
            pass
        except OSError:
            self._disconnect()
        bug: StoreBug | None = None
        try:
            self._handle_inbox()
        except StoreBug as exc:  # every reply read was handled: the rest are unanswered
            bug = exc
        if self.sock is None:
            self._fail_all(StoreUnavailable("the store process exited"))
        if bug is not None:
            raise bug

    def _handle_inbox(self) -> None:
        """Hand every reply read to its callback. A reply that is a bug is raised once all
        of them are handled (a claim answered behind it is a claim, not a loss); a callback
        that raises stops here, the replies read with it left in the inbox for the
        emergency stop that follows."""
        bug: StoreBug | None = None
        while (message := storewire.next_frame(self.inbox)) is not None:
            req_id, payload = message
            if req_id == storewire.WAKE:
                self.on_wake(payload)
                continue
            entry = self.calls.pop(req_id, None)
            if entry is not None:
                self.deaths = 0
                try:
                    deliver(entry[2], payload)
                except StoreBug as exc:
                    bug = bug or exc
        if bug is not None:
            raise bug

    # ---- internals -----------------------------------------------------------------------

    def _send(self) -> None:
        if self.sock is None or not self.outbox:
            return
        try:
            sent = self.sock.send(self.outbox)
        except BlockingIOError:
            return  # its buffer is full (a long call): the rest goes on a later pass
        except OSError:
            # it is exiting: the calls fail when it is reaped (``exited``) or when the reading
            # in hand is done (``on_readable``), not here, where a reply read already but not
            # yet handled (a submit from a reply's callback) would be failed with the rest
            self._disconnect()
            return
        del self.outbox[:sent]

    def _disconnect(self) -> None:
        if self.sock is not None:
            if self.unwatch is not None:
                self.unwatch(self.sock.fileno())
            self.sock.close()
            self.sock = None

    def _fail_all(self, error: StoreError) -> None:
        calls, self.calls = self.calls, {}
        for _, _, on_reply in calls.values():
            on_reply(Reply(None, error, 0.0))
