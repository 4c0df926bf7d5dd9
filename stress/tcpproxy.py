"""A TCP proxy the test controls, to take a database away from a supervisor and give it back
without touching the server other tests use. ``cut()`` drops every connection and refuses new
ones (connection reset at once); ``restore()`` lets them through again. ``stall()`` keeps every
connection open but forwards nothing, new ones included (a partition, a stalled server: the
client's calls just wait); ``resume()`` forwards again, the held bytes first.

Runs in threads of the process that made it (a test, the chaos harness; never a supervisor),
on loopback only.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._open = True
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self.connections = 0  # accepted while open
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._open:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._pairs.append((client, upstream))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while not self._stop.is_set():
                if not self._flowing.wait(0.1):
                    continue  # stalled: the bytes wait in the kernel's buffers
                for key, _ in sel.select(0.1):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            for s in (a, b):
                _reset(s)

    def cut(self) -> None:
        """Drop every connection now and refuse new ones until ``restore``."""
        self._open = False
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            _reset(a)
            _reset(b)

    def restore(self) -> None:
        self._open = True

    def stall(self) -> None:
        """Forward nothing, on open and new connections, until ``resume``."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._stop.set()
        self._flowing.set()
        self.cut()
        self.listener.close()


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(OSError):
        sock.close()
