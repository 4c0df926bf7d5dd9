"""The stall fault of ``python -m stress chaos``: the database stops answering for a few seconds
while every connection stays open, and then answers again. Calls do not fail, they wait: the
fault a supervisor must ride out without its kills, drains and health waiting with them.

- PostgreSQL: the supervisors reach the server through a TCP proxy in the harness
  (``stress/tcpproxy.py``), which stops forwarding, on open and new connections alike (a
  partition, a stalled server, a failover). The harness's own connections go direct.
- SQLite: a process takes the write lock (``BEGIN IMMEDIATE``) and holds it, as a backup, a big
  import or a ``sqlite3`` shell does; readers go on (WAL), every writer waits.

A stall is recorded as an outage (``DbRestart`` with ``began`` and ``ready``) so the checks
explain what it may cause the same way as a server restart.
"""

from __future__ import annotations

import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

from stress.chaos_checks import DbRestart
from stress.tcpproxy import TcpProxy

# holds SQLite's write lock for argv[2] seconds, saying so on stdout once it has it
LOCKER = (
    "import sqlite3, sys, time\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)\n"
    "db.execute('BEGIN IMMEDIATE')\n"
    "print('locked', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "db.execute('COMMIT')\n"
)


class Staller:
    """Starts and ends stalls of one database; ``supervisor_url`` is the URL supervisors
    must use for a stall to reach them (through the proxy, on PostgreSQL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.proxy: TcpProxy | None = None
        self.supervisor_url = url
        parts = urlsplit(url)
        if parts.scheme.startswith("postgresql"):
            self.proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
            user = parts.netloc.rpartition("@")[0]
            netloc = (
                f"{user}@127.0.0.1:{self.proxy.port}" if user else f"127.0.0.1:{self.proxy.port}"
            )
            self.supervisor_url = urlunsplit(parts._replace(netloc=netloc))
        self.locker: subprocess.Popen[str] | None = None
        self.began = 0.0
        self.ends = 0.0

    @property
    def active(self) -> bool:
        return self.began > 0.0

    def begin(self, seconds: float) -> None:
        """Stall the database for ``seconds`` (returns once the stall holds)."""
        if self.proxy is not None:
            self.proxy.stall()
        else:
            path = make_url(self.url).database or ""
            self.locker = subprocess.Popen(
                [sys.executable, "-c", LOCKER, path, str(seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self.locker.stdout is not None
            if self.locker.stdout.readline().strip() != "locked":  # no stall: say so
                self.locker.wait()
                self.locker = None
                raise RuntimeError(f"chaos: could not take the write lock of {path}")
        self.began = time.time()
        self.ends = time.monotonic() + seconds

    def poll(self) -> DbRestart | None:
        """The stall that just ended, once it has; None while one lasts or none does."""
        if not self.active:
            return None
        if self.proxy is not None:
            if time.monotonic() < self.ends:
                return None
            self.proxy.resume()
        elif self.locker is not None:
            if self.locker.poll() is None:
                return None
            self.locker = None
        stall = DbRestart(began=self.began, ready=time.time())
        self.began = 0.0
        return stall

    def finish(self) -> DbRestart:
        """End the stall now (the run is over); its record."""
        self._release_lock()
        self.ends = 0.0
        stall = self.poll()
        assert stall is not None
        return stall

    def close(self) -> None:
        """End any stall now and stop the proxy."""
        self._release_lock()
        if self.proxy is not None:
            self.proxy.close()

    def _release_lock(self) -> None:
        if self.locker is not None:
            self.locker.kill()
            self.locker.wait()
            self.locker = None
