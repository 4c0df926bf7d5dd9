"""Wake-ups: how an idle supervisor learns at once that a job was enqueued, instead of waiting
for its next poll. Polling stays the safety net (delayed jobs, retries, a lost wake-up).

- PostgreSQL: ``LISTEN fleetd_jobs`` on a connection of its own; enqueue sends ``NOTIFY`` with
  the pool's name inside its transaction, so the wake-up arrives after the commit.
- SQLite: there is no server to notify through, so each supervisor binds a Unix datagram socket
  in a folder named after the database file, and a process that enqueued sends each of them the
  pool's name after its commit. Only processes of the same user on the same host can wake each
  other this way (the folder is mode 0700); anything else falls back to polling.

A ``Waker`` exposes ``fileno()`` for the supervisor's selector and ``drain()``, which returns
the pools named since the last call (an empty set when the connection was lost: the caller
then recreates it, and polls meanwhile).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Protocol

# The name a wake-up carries to say "read the controls now" (a cancel, a pause, a resume):
# no pool can have it (pool names are identifiers)
CONTROLS_WAKE = "*controls"


class Waker(Protocol):
    broken: bool

    def fileno(self) -> int: ...
    def drain(self) -> set[str]: ...
    def close(self) -> None: ...


def wake_folder(database_path: str) -> Path:
    """The folder of wake-up sockets for one SQLite file (short: socket paths max 107 bytes)."""
    digest = hashlib.sha1(os.path.abspath(database_path).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"fleetd-{os.getuid()}-{digest}"


class LocalWaker:
    """The SQLite supervisor's end: a datagram socket named after this process."""

    def __init__(self, database_path: str) -> None:
        self.broken = False
        folder = wake_folder(database_path)
        folder.mkdir(mode=0o700, exist_ok=True)
        self.path = folder / f"{os.getpid()}.sock"
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket of an earlier process with our pid
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> set[str]:
        pools: set[str] = set()
        while True:
            try:
                pools.add(self.sock.recv(512).decode(errors="replace"))
            except BlockingIOError:
                return pools

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def wake_local(database_path: str, pools: set[str]) -> None:
    """Tell every supervisor on this host that shares ``database_path`` about new jobs.
    Best effort, never blocks, never raises: a missed wake-up costs one poll interval."""
    folder = wake_folder(database_path)
    try:
        targets = [p for p in folder.iterdir() if p.suffix == ".sock"]
    except OSError:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        for target in targets:
            for pool in pools:
                if not _send(sock, pool.encode(), target):
                    break


def _send(sock: socket.socket, data: bytes, target: Path) -> bool:
    try:
        sock.sendto(data, str(target))
        return True
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            with contextlib.suppress(OSError):
                target.unlink()  # its supervisor is gone
        return False  # EAGAIN: ten wake-ups wait there already (it reads them between calls)


class PostgresWaker:
    """LISTEN on a dedicated autocommit connection (psycopg 3)."""

    def __init__(self, conninfo: str, channel: str, bounds: dict[str, int]) -> None:
        import psycopg

        self.broken = False
        self.conn: Any = psycopg.connect(conninfo, autocommit=True, **bounds)
        self.conn.execute(f"LISTEN {channel}")
        # Kept: psycopg's fileno() raises once the connection is lost, and the loop still has
        # to unregister the descriptor then.
        self._fd = int(self.conn.fileno())

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> set[str]:
        try:
            return {n.payload for n in self.conn.notifies(timeout=0)}
        except Exception:  # the connection is gone: report it, the caller recreates
            self.broken = True
            return set()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
