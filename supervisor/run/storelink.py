"""How the supervisor's loop uses the store without ever waiting for it.

    loop (parent) ──submit(call, args, on_reply)──> socket ──> store process: open_store(url)
         ^                                                        │ runs calls in order, one
         └──── on_reply(Reply) ── selector callback <── socket <──┘ at a time; wake-ups too

Every store call of the running supervisor goes through a link. ``ProcessLink`` hands it to a
process of the supervisor's own, forked at boot, which holds the database connections and runs
the calls one after the other; the loop goes on at once and gets the reply through its
selector. However long a call takes (a stalled server, a network partition, another process
holding SQLite's write lock), the loop keeps killing jobs at their deadline, stopping memory
bombs, reaping and forking workers, answering /metrics and /healthz and acting on signals.
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
import pickle
import selectors
import signal
import socket
import struct
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.errors import StoreError, StoreUnavailable
from supervisor.run import storecalls
from supervisor.run.workerproc import fork_paired, reap_within

log = logging.getLogger("fleetd.store")

CALL_LIMIT = 90.0  # seconds a call may stay unanswered before the store process is replaced
SLOW_CALL = 1.0  # seconds: a call that took longer is logged by the store process
# an armed claim: run by the store process the moment a wake-up (NOTIFY, SQLite's datagram)
# names its pool, or when the pool's poll is due, whichever is first; DISARM runs them all now
ARMED_CLAIM = "claim_on_wake"
DISARM = "disarm"
FIRE = "fire"  # run one pool's armed claim now
RETIME = "retime"  # bring one pool's armed claim's deadline forward
WAKE_EVERY = 0.002  # seconds of calls after which the store process reads its wake-ups
RESPAWN_BACKOFF = (0.2, 5.0)  # first and longest wait before forking a dead store process again
_HEADER = struct.Struct("!I")
_WAKE = -1  # request id of an unsolicited message: pools named by a wake-up
_CHUNK = 64 << 10  # bytes one read of the socket takes at most (a longer frame: several)


@dataclass(frozen=True, slots=True)
class Reply:
    """What a call came back with. ``started`` is when the store process began it
    (monotonic, the same clock in every process of the host): a lease it took or extended
    runs out no earlier than ``started`` plus the lease."""

    value: Any
    error: StoreError | None
    started: float

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as a call with its fields: a slots dataclass's own way (its state set
        # field by field in Python) was ~10 µs of every reply, on each side of the socket
        return (Reply, (self.value, self.error, self.started))


OnReply = Callable[[Reply], None]


def execute(
    store: Any,
    call: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    monotonic: Callable[[], float],
) -> Reply:
    """Run one call; a store error becomes the reply's error, anything else a StoreError
    (logged with its traceback here: it is a bug, and the caller only sees its line)."""
    started = monotonic()
    try:
        return Reply(storecalls.run(store, call, args, kwargs), None, started)
    except StoreError as exc:
        return Reply(None, exc, started)
    except Exception as exc:
        log.error("store call %s failed:\n%s", call, traceback.format_exc())
        return Reply(None, StoreError(f"{call}: {type(exc).__name__}: {exc}"), started)


class InlineLink:
    """Calls run in the caller's thread, the reply given before ``submit`` returns."""

    def __init__(self, store: Any, monotonic: Callable[[], float]) -> None:
        self.store = store
        self.monotonic = monotonic
        self.on_wake: Callable[[set[str]], None] = lambda pools: None

    arms_claims = False  # a claim never waits for a wake-up inline

    def submit(self, call: str, *args: Any, on_reply: OnReply, **kwargs: Any) -> None:
        on_reply(execute(self.store, call, args, kwargs, self.monotonic))

    def waiting_since(self) -> float | None:
        return None

    def pending(self) -> int:
        return 0

    def attach(self, watch: Any, unwatch: Any) -> None:
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

    def __init__(self, database: str, *, title: str, listen: bool) -> None:
        self.database = database
        self.title = title
        self.listen = listen  # the store process takes the wake-ups and forwards them
        self.on_wake: Callable[[set[str]], None] = lambda pools: None
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.inbox = bytearray()
        self.chunk = memoryview(bytearray(_CHUNK))  # what one read takes (``_receive``)
        self.outbox = bytearray()  # frames the kernel did not take yet
        self.calls: dict[int, tuple[str, float, OnReply]] = {}  # id -> (call, sent, on_reply)
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
                code = _serve(child_end, self.database, self.title, self.listen, parent)
            finally:
                os._exit(code)
        child_end.close()
        parent_end.setblocking(False)
        self.pid, self.sock = pid, parent_end
        self.inbox.clear()
        self.outbox.clear()
        if self.watch is not None:
            self.watch(parent_end.fileno(), self.on_readable)

    def attach(self, watch: Callable[..., None], unwatch: Callable[[int], None]) -> None:
        self.watch, self.unwatch = watch, unwatch
        if self.sock is not None:
            watch(self.sock.fileno(), self.on_readable)

    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock is not None else None

    def exited(self, status: int, now: float) -> None:
        """The store process was reaped: the replies it wrote before it died are handled,
        every other call it held failed; another is forked after a backoff."""
        if self.sock is not None:
            self.on_readable()  # replies already in the socket are replies, not losses
        self._handle_inbox()  # and those read before a failed send disconnected it
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
        """Whether a claim may wait in the store process for a wake-up (``ARMED_CLAIM``)."""
        return self.listen

    def submit(self, call: str, *args: Any, on_reply: OnReply, **kwargs: Any) -> None:
        """Send a call; ``on_reply`` runs from the loop when it is answered (with a
        StoreUnavailable error if the store process is not running or dies first)."""
        if self.sock is None:
            on_reply(Reply(None, StoreUnavailable("the store process is not running"), 0.0))
            return
        self.next_id += 1
        request = (self.next_id, call, args, kwargs)
        body = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        # an armed claim is due only when its pool's poll is: not a call the store sits on
        due = time.monotonic() + (args[1] if call == ARMED_CLAIM else 0.0)
        self.calls[self.next_id] = (call, due, on_reply)
        self.outbox += _HEADER.pack(len(body)) + body
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
                if not _receive(self.sock, self.inbox, self.chunk):
                    self._disconnect()  # it is exiting; its status comes with SIGCHLD
                    break
        except BlockingIOError:
            pass
        except OSError:
            self._disconnect()
        self._handle_inbox()
        if self.sock is None:
            self._fail_all(StoreUnavailable("the store process exited"))

    def _handle_inbox(self) -> None:
        # one frame at a time: if a callback raises (the loop's error policy takes over),
        # the replies read with it stay in the inbox for the emergency stop
        while (message := _next_frame(self.inbox)) is not None:
            req_id, payload = message
            if req_id == _WAKE:
                self.on_wake(payload)
                continue
            entry = self.calls.pop(req_id, None)
            if entry is not None:
                self.deaths = 0
                entry[2](payload)

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


def _receive(sock: socket.socket, inbox: bytearray, chunk: memoryview) -> int:
    """Read what ``sock`` holds (up to the chunk's size) onto ``inbox``; the bytes read, 0 at
    EOF. Into a buffer kept for the process: ``recv(1 MiB)`` had the allocator map, shrink
    and unmap a megabyte for every request in the store process (three system calls, seen
    with strace)."""
    n = sock.recv_into(chunk)
    inbox += chunk[:n]
    return n


def _next_frame(buffer: bytearray) -> Any | None:
    """The first complete frame in ``buffer``, unpickled and removed; None if there is none."""
    if len(buffer) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack_from(buffer, 0)
    if len(buffer) - _HEADER.size < size:
        return None
    message = pickle.loads(buffer[_HEADER.size : _HEADER.size + size])
    del buffer[: _HEADER.size + size]
    return message


def _frames(buffer: bytearray) -> list[Any]:
    """Every complete frame at the start of ``buffer``, unpickled; removed from it."""
    out: list[Any] = []
    at = 0
    while len(buffer) - at >= _HEADER.size:
        (size,) = _HEADER.unpack_from(buffer, at)
        if len(buffer) - at - _HEADER.size < size:
            break
        start = at + _HEADER.size
        out.append(pickle.loads(buffer[start : start + size]))
        at = start + size
    del buffer[:at]
    return out


# ---- the store process ---------------------------------------------------------------------


def _serve(sock: socket.socket, database: str, title: str, listen: bool, parent: int) -> int:
    """The store process: run calls in order until the loop's end closes. It dies with the
    parent (PR_SET_PDEATHSIG) and ignores SIGINT/SIGTERM: the parent coordinates shutdown."""
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
    store = open_store(database, migrate=False, bounded=True)  # the parent migrated it
    waker = _Listener(store) if listen else None
    armed: dict[str, tuple[int, dict[str, Any], float]] = {}  # pool -> (id, claim, deadline)
    sock.setblocking(True)
    inbox = bytearray()
    chunk = memoryview(bytearray(_CHUNK))
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)

    def run(req_id: int, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        reply = execute(store, call, args, kwargs, time.monotonic)
        took = time.monotonic() - reply.started
        if took > SLOW_CALL:
            log.warning("store call %s took %.1fs", call, took)
        _reply(sock, req_id, reply)

    def fire(pool: str) -> None:
        req_id, claim, _ = armed.pop(pool)
        run(req_id, "claim_rows", (), claim)

    drained_at = 0.0

    def take_wakeups() -> None:
        """Run the armed claims of the pools a wake-up names; forward the rest to the loop."""
        nonlocal drained_at
        drained_at = time.monotonic()
        pools = waker.drain(sel)
        forward = pools - armed.keys()  # before firing: a fired pool needs no wake
        for pool in pools & armed.keys():
            fire(pool)  # the claim runs here, a round trip to the loop sooner
        if forward:
            _reply(sock, _WAKE, forward)

    try:
        while True:
            if waker is not None:
                waker.register(sel)
            timeout = 1.0 if waker is not None else None
            if armed:
                soonest = min(deadline for _, _, deadline in armed.values())
                timeout = max(0.0, min(timeout or 1.0, soonest - time.monotonic()))
            for key, _ in sel.select(timeout=timeout):
                if key.fileobj is sock and not _receive(sock, inbox, chunk):
                    return 0  # the loop closed its end: done
            if waker is not None:
                take_wakeups()
            now = time.monotonic()
            for pool in [p for p, (_, _, deadline) in armed.items() if deadline <= now]:
                fire(pool)  # its poll is due: claim whether or not a wake-up came
            for req_id, call, args, kwargs in _frames(inbox):
                if call == ARMED_CLAIM:  # args: the pool, seconds until its poll
                    pool, wait = args
                    armed[pool] = (req_id, kwargs, time.monotonic() + wait)
                elif call == DISARM:  # every armed claim now (a drain): answered at once
                    for pool in list(armed):
                        fire(pool)
                    run(req_id, "claim_rows_none", (), {})
                elif call == FIRE:  # the loop learned of new jobs first (args: the pool)
                    if args[0] in armed:
                        fire(args[0])
                    run(req_id, "claim_rows_none", (), {})
                elif call == RETIME:  # a retry comes due sooner (args: the pool, seconds)
                    if args[0] in armed:
                        held_id, claim, deadline = armed[args[0]]
                        armed[args[0]] = (held_id, claim, min(deadline, time.monotonic() + args[1]))
                    run(req_id, "claim_rows_none", (), {})
                else:
                    run(req_id, call, args, kwargs)
                if waker is not None and time.monotonic() - drained_at > WAKE_EVERY:
                    # also between calls: SQLite's datagram socket queues ten wake-ups, and
                    # an enqueuer that finds it full drops its own (a poll later)
                    take_wakeups()
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        if waker is not None:
            waker.close()
        store.close()


def _reply(sock: socket.socket, req_id: int, payload: Any) -> None:
    body = pickle.dumps((req_id, payload), protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(body)) + body)


class _Listener:
    """The store process's wake-up channel (PostgreSQL's LISTEN connection, SQLite's datagram
    socket: supervisor/store/wake.py), made again when lost."""

    def __init__(self, store: Any) -> None:
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
