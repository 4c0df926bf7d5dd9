"""The database-restart fault of ``python -m stress chaos --allow-db-restart``: the local
PostgreSQL server is restarted (``pg_ctlcluster --skip-systemctl-redirect <version> main
restart``: a fast shutdown that ends every connection, then a start), and the harness waits
until ``pg_isready`` says the server accepts connections again.

Only a server on this host can be restarted this way, so the database URL must name a local
host (or none: the Unix socket), and ``/etc/postgresql/<version>/main`` must exist (one
version, or the one whose ``postgresql.conf`` has the URL's port). ``cluster_for`` checks all
of that before the run starts and says in one line what is missing.

A restart is never cut short: an interrupt (Ctrl-C, SIGTERM) that arrives while
``pg_ctlcluster`` runs waits for it to finish, and ``ensure_running`` starts the server again
if it was left stopped, so a run (or a test) never leaves the server down.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stress.chaos_checks import DbRestart

ETC = Path("/etc/postgresql")
CLUSTER = "main"
RESTART_TIMEOUT = 60.0  # s for pg_ctlcluster, and again for the server to accept connections
LOCAL_HOSTS = (None, "", "127.0.0.1", "localhost", "::1")
_PORT = re.compile(r"^\s*port\s*=\s*(\d+)", re.MULTILINE)


class NotRestartable(Exception):
    """The database of this run cannot be restarted by the harness (the message says why)."""


class RestartFailed(Exception):
    """pg_ctlcluster failed, or the server did not accept connections in time."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """A cluster of this host (Debian's postgresql-common layout), and where it listens."""

    version: str
    host: str | None
    port: int

    def command(self, action: str) -> list[str]:
        """``pg_ctlcluster`` for ``action`` (restart, start) on this cluster."""
        ctl = shutil.which("pg_ctlcluster") or "pg_ctlcluster"
        return [ctl, "--skip-systemctl-redirect", self.version, CLUSTER, action]

    def ready_command(self) -> list[str]:
        """``pg_isready`` against the address the run's URL names (exit 0: accepting)."""
        host = ["-h", self.host] if self.host else []
        return ["pg_isready", *host, "-p", str(self.port), "-t", "1"]


def cluster_for(url: str, etc: Path = ETC) -> Cluster:
    """The local cluster serving ``url``; ``NotRestartable`` with the reason otherwise."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise NotRestartable(f"{url!r} is not a database URL") from exc
    if parsed.get_backend_name() != "postgresql":
        raise NotRestartable(
            f"needs PostgreSQL (--database postgres or a postgresql:// URL), not "
            f"{parsed.get_backend_name()}: there is no database server to restart"
        )
    if parsed.host not in LOCAL_HOSTS:
        raise NotRestartable(
            f"restarts the PostgreSQL server on this host, but the database is on {parsed.host}"
        )
    for tool in ("pg_ctlcluster", "pg_isready"):
        if shutil.which(tool) is None:
            raise NotRestartable(f"{tool} is not on PATH (Debian's postgresql-common)")
    port = parsed.port or 5432
    versions = sorted(p.parent.name for p in etc.glob(f"*/{CLUSTER}") if p.is_dir())
    if len(versions) > 1:
        versions = [v for v in versions if _conf_port(etc / v / CLUSTER) == port]
    if len(versions) != 1:
        raise NotRestartable(
            f"found no single cluster '{CLUSTER}' with port {port} under {etc}/<version>/"
        )
    owner = (etc / versions[0] / CLUSTER).stat().st_uid
    if os.geteuid() not in (0, owner):
        raise NotRestartable("pg_ctlcluster needs root or the cluster's owner")
    return Cluster(versions[0], parsed.host or None, port)


def _conf_port(folder: Path) -> int:
    try:
        m = _PORT.search((folder / "postgresql.conf").read_text())
    except OSError:
        return -1
    return int(m[1]) if m else 5432


def is_ready(cluster: Cluster) -> bool:
    """The server accepts connections now."""
    return subprocess.run(cluster.ready_command(), capture_output=True).returncode == 0


def wait_ready(cluster: Cluster, timeout: float = RESTART_TIMEOUT) -> bool:
    """Poll ``pg_isready`` until the server accepts connections; False after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not is_ready(cluster):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def restart(cluster: Cluster) -> DbRestart:
    """Restart the server and wait until it accepts connections; ``RestartFailed`` if not.
    While ``pg_ctlcluster`` runs, ``pg_isready`` is polled to time the outage itself: the
    command returns a while after the server accepts connections again."""
    began = time.time()
    down: list[float] = []  # when pg_isready said no, while the command ran

    def probe() -> None:
        if not is_ready(cluster):
            down.append(time.time())

    out = _run_through(cluster.command("restart"), probe)
    if out.returncode != 0:
        raise RestartFailed(
            f"pg_ctlcluster restart exited {out.returncode}: {_last_line(out.stdout)}"
        )
    if not wait_ready(cluster):
        raise RestartFailed(f"the server refused connections {RESTART_TIMEOUT:.0f}s after restart")
    ready = time.time()
    return DbRestart(began, ready, down[0] if down else None, down[-1] if down else None)


def ensure_running(cluster: Cluster) -> bool:
    """Leave the server accepting connections: wait for it, start it if it stays down."""
    if wait_ready(cluster, timeout=10.0):
        return True
    _run_through(cluster.command("start"))
    return wait_ready(cluster)


def _run_through(
    command: list[str], meanwhile: Callable[[], None] = lambda: None
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end, calling ``meanwhile`` in a loop while it runs; finish it
    even when interrupted (in its own session, so a Ctrl-C to the terminal's process group
    does not reach it): a half-done restart leaves the server stopped."""
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + RESTART_TIMEOUT
            while proc.poll() is None and time.monotonic() < deadline:
                meanwhile()
                time.sleep(0.02)
            proc.wait(max(0.0, deadline - time.monotonic()))
        except BaseException:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(RESTART_TIMEOUT)
            raise
        output.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, output.read())


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
