"""``MetricsServer``: GET /metrics and GET /healthz, served from the supervisor's own loop.

Why not ``prometheus_client.start_http_server``: it runs a thread, and the supervisor forks.
A thread alive at ``fork()`` can hold a lock the child then waits on forever (the logging
module's, the allocator's), so the parent never starts one. Instead a non-blocking listening
socket sits in the loop's selector beside the worker pipes:

    accept ──> read until the blank line (8 KiB at most) ──> answer ──> close
               one request per connection (HTTP/1.0, ``Connection: close``)

Nothing here blocks: reads and writes happen only when the selector says the socket is ready,
a response the kernel does not take at once waits for writability, and a client that is too
slow (``CLIENT_TIMEOUT``) or one too many (``MAX_CLIENTS``) is dropped. The body is rendered
from the latest snapshot (built once a second), so a scrape costs no store query.

A forked worker closes the listening socket and every client socket first thing
(``close_in_child``), so no child ever answers a scrape or keeps the port open.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from supervisor.observe import health, metrics
from supervisor.observe.snapshot import FleetSnapshot

log = logging.getLogger("fleetd.metrics")

MAX_REQUEST = 8192
MAX_CLIENTS = 16
CLIENT_TIMEOUT = 5.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


@dataclass
class _Client:
    sock: socket.socket
    opened: float
    inbox: bytes = b""
    outbox: memoryview = field(default_factory=lambda: memoryview(b""))


Source = Callable[[], tuple[FleetSnapshot | None, float]]  # latest snapshot and its age


class MetricsServer:
    def __init__(self, sock: socket.socket, source: Source, clock: Callable[[], float]) -> None:
        self.sock = sock
        self.source = source
        self.clock = clock
        self.registry = metrics.make_registry(lambda: self.source()[0])
        self.clients: dict[int, _Client] = {}  # by fd; owned by the main thread
        self.loop: Any = None

    @classmethod
    def bind(cls, address: tuple[str, int], source: Source, clock: Callable[[], float]):
        """Listen on ``address`` (raises OSError: the port is taken, the address is not ours)."""
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return cls(sock, source, clock)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def attach(self, loop: Any) -> None:
        self.loop = loop
        loop.watch(self.sock.fileno(), self._accept)

    # ---- connections -------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: try again on the next readiness
                log.warning("metrics: accept failed: %s", exc)
                return
            if len(self.clients) >= MAX_CLIENTS:
                conn.close()
                continue
            conn.setblocking(False)
            client = _Client(conn, self.clock())
            self.clients[conn.fileno()] = client
            self.loop.watch(conn.fileno(), lambda c=client: self._readable(c))

    def _readable(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(MAX_REQUEST)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(client)
            return
        client.inbox += chunk
        if b"\r\n\r\n" in client.inbox or b"\n\n" in client.inbox:
            self._send(client, self.respond(client.inbox))
        elif len(client.inbox) > MAX_REQUEST:
            self._send(client, _response(400, "text/plain", b"request too large\n"))

    def _send(self, client: _Client, data: bytes) -> None:
        self.loop.unwatch(client.sock.fileno())
        client.outbox = memoryview(data)
        self._writable(client, first=True)

    def _writable(self, client: _Client, first: bool = False) -> None:
        try:
            sent = client.sock.send(client.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(client)
            return
        client.outbox = client.outbox[sent:]
        if not client.outbox:
            self._close(client)
        elif first:
            self.loop.watch_write(client.sock.fileno(), lambda: self._writable(client))

    def _close(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if self.loop is not None and fd >= 0:
            self.loop.unwatch(fd)
        self.clients.pop(fd, None)
        with contextlib.suppress(OSError):
            client.sock.close()

    def expire(self, now: float) -> None:
        """Drop clients that have not finished within ``CLIENT_TIMEOUT`` (slow or idle)."""
        for client in [c for c in self.clients.values() if now - c.opened > CLIENT_TIMEOUT]:
            self._close(client)

    # ---- requests ----------------------------------------------------------------------

    def respond(self, request: bytes) -> bytes:
        """The whole HTTP/1.0 response to one request."""
        line = request.split(b"\n", 1)[0].decode("latin-1").strip()
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response(400, "text/plain", b"bad request\n")
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response(405, "text/plain", b"GET only\n")
        if target == "/metrics":
            status, ctype, body = 200, CONTENT_TYPE_LATEST, metrics.render(self.registry)
        elif target in ("/healthz", "/health"):
            status, ctype, body = self.health()
        elif target == "/":
            status, ctype, body = 200, "text/plain", b"fleetd: /metrics /healthz\n"
        else:
            status, ctype, body = 404, "text/plain", b"not found: /metrics or /healthz\n"
        return _response(status, ctype, body, head=method == "HEAD")

    def health(self) -> tuple[int, str, bytes]:
        snap, age = self.source()
        if snap is None:
            verdict = health.Verdict(False, ())
            body: dict[str, Any] = {**verdict.to_dict(), "detail": "starting: no snapshot yet"}
        else:
            verdict = health.judge(snap, age)
            body = {
                **verdict.to_dict(),
                "node": snap.node_id,
                "state": snap.state,
                "store": {
                    "ok": snap.store_ok,
                    "failures_in_a_row": snap.store_failures,
                    "waiting_for": snap.store_wait,  # seconds: a call the database sits on
                },
            }
        data = (json.dumps(body, indent=1) + "\n").encode()
        return (200 if verdict.healthy else 503), "application/json", data

    # ---- the end -----------------------------------------------------------------------

    def close(self) -> None:
        for client in list(self.clients.values()):
            self._close(client)
        if self.loop is not None:
            self.loop.unwatch(self.sock.fileno())
        self.sock.close()

    def close_in_child(self) -> None:
        """In a forked worker: close every socket without touching the parent's selector."""
        for client in self.clients.values():
            with contextlib.suppress(OSError):
                client.sock.close()
        with contextlib.suppress(OSError):
            self.sock.close()


def _response(status: int, ctype: str, body: bytes, head: bool = False) -> bytes:
    header = (
        f"HTTP/1.0 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")
    return header + (b"" if head else body)
