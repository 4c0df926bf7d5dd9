"""Handlers for benchmarks and stress runs, usable from any fleet.toml as
``stress.fixtures:<name>``. Plain functions: JSON in, JSON out.

Well-behaved: ``noop``, ``burn`` (CPU for N ms), ``sleep``, ``hog`` (N MiB held for N ms),
``leak`` (N MiB left behind in the worker for good), ``flaky`` (raises until attempt K),
``downstream`` (a slow call, optionally behind a file-lock semaphore of N slots that stands
for a rate-limited service), ``stubborn`` (ignores SIGTERM while it sleeps).

Hostile: ``gradual_bomb``, ``instant_bomb``, ``hang``, ``crash_exit`` (``os._exit(code)``),
``crash_segv`` (SIGSEGV), ``crash_sigkill`` (SIGKILL of itself), ``fork_bomb`` (refuses to run
unless RLIMIT_NPROC binds it: a non-root uid and a small limit; see ``fork_bomb``).

The execution log
-----------------
With ``"log": "/path"`` in the payload, each execution appends one JSON line to that file::

    {"job": 12, "attempt": 1, "pid": 4242, "ppid": 4200, "kind": "burn", "start": 1.7e9,
     "end": 1.7e9, "outcome": "ok"}

``outcome`` is ``ok`` (returned), ``raised`` (an exception; ``error`` names it) or ``started``
(fixtures that end their process or never return write their line first, with ``end`` null).
``ppid`` is the supervisor whose forker forked the worker (``supervisor_pid``), so a run can
tell which supervisor ran what.
Fixtures add their own figures (``downstream``: ``slot`` and ``waited``). Each line is one
``os.write`` on an fd opened with O_APPEND, so lines from concurrent workers never interleave;
the file is created mode 0666, so workers that dropped privileges (a pool's ``user``) append
to the same log as the others (the folder must let them in).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import json
import os
import resource
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from workers import Permanent, current_job

MIB = 1024 * 1024
GIB = 1024 * MIB

Payload = dict[str, Any]
_leaked: list[bytes] = []  # what ``leak`` keeps, for the life of the worker


def supervisor_pid() -> int:
    """The supervisor running this worker: the parent of its parent, the forker
    (workers/forker.py); outside fleetd, the parent."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            title = f.read().split(b"\0")[0]
        if title.startswith(b"fleetd: forker"):
            with open(f"/proc/{parent}/stat", "rb") as f:
                return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return parent


def record(payload: Payload, start: float, end: float | None, outcome: str, **extra: Any) -> None:
    """Append this execution's line to ``payload["log"]``, if given, in one write call."""
    path = payload.get("log") if isinstance(payload, dict) else None
    if not path:
        return
    try:
        ctx = current_job()
        job, attempt, kind = ctx.id, ctx.attempt, ctx.kind
    except RuntimeError:  # called outside fleetd (a unit test, a REPL)
        job, attempt, kind = None, None, None
    line = {
        "job": job,
        "attempt": attempt,
        "pid": os.getpid(),
        "ppid": supervisor_pid(),
        "kind": kind,
        "start": start,
        "end": end,
        "outcome": outcome,
        **extra,
    }
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def recorded(fn: Callable[[Payload], Any]) -> Callable[[Payload], Any]:
    """Decorator: ``record`` one line when ``fn`` returns or raises. A function that wants to
    add figures to its line returns ``(result, extra_dict)`` via ``_with``."""

    @functools.wraps(fn)
    def wrapper(payload: Payload) -> Any:
        start = time.time()
        try:
            result = fn(payload)
        except BaseException as exc:
            record(payload, start, time.time(), "raised", error=type(exc).__name__)
            raise
        extra: dict[str, Any] = {}
        if isinstance(result, _With):
            result, extra = result.result, result.extra
        record(payload, start, time.time(), "ok", **extra)
        return result

    return wrapper


class _With:
    """A result plus figures for the execution log line (see ``recorded``)."""

    def __init__(self, result: Any, **extra: Any) -> None:
        self.result = result
        self.extra = extra


def _started(payload: Payload) -> None:
    """The line of a fixture that will not return: written before it does its damage."""
    record(payload, time.time(), None, "started")


# ---- well-behaved ----------------------------------------------------------------------


@recorded
def noop(payload: Payload) -> None:
    """Does nothing: measures fleetd's own overhead per job."""


_redis: dict[tuple[str, int], Any] = {}  # one connection per worker process and server


def redis_incr(payload: Payload) -> int:
    """One network round trip: ``INCR`` of ``key`` (default ``fleetd:bench``) on the Redis
    at ``host``:``port`` (default 127.0.0.1:6379), over a connection the worker keeps. Speaks
    RESP itself (no client library); returns the new value."""
    server = (str(payload.get("host", "127.0.0.1")), int(payload.get("port", 6379)))
    conn = _redis.get(server)
    if conn is None:
        conn = _redis[server] = socket.create_connection(server).makefile("rwb")
    return incr(conn, str(payload.get("key", "fleetd:bench")).encode())


def incr(conn: Any, key: bytes) -> int:
    """``INCR key`` on a RESP connection (a buffered socket file); the reply's integer."""
    conn.write(b"*2\r\n$4\r\nINCR\r\n$%d\r\n%s\r\n" % (len(key), key))
    conn.flush()
    line = conn.readline()
    if not line.startswith(b":"):
        raise RuntimeError(f"redis: {line.decode(errors='replace').strip()}")
    return int(line[1:])


@recorded
def burn(payload: Payload) -> int:
    """CPU for ``ms`` milliseconds."""
    end = time.perf_counter() + payload.get("ms", 10) / 1000
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


@recorded
def sleep(payload: Payload) -> None:
    """Waits ``seconds``."""
    time.sleep(float(payload.get("seconds", 0.1)))


@recorded
def hog(payload: Payload) -> int:
    """Touch ``mib`` MiB (default 100), hold it ``ms`` milliseconds (default 100), free it."""
    block = bytearray(int(payload.get("mib", 100)) * MIB)
    for i in range(0, len(block), 4096):  # bytearray() is calloc'd: touch every page
        block[i] = 1
    time.sleep(float(payload.get("ms", 100)) / 1000)
    return len(block)


@recorded
def leak(payload: Payload) -> int:
    """Keep ``mib`` touched MiB (default 1) in the worker for good; return the total kept.
    A pool running it needs ``recycle_rss`` (or ``max_jobs_per_worker``) below its limit."""
    _leaked.append(b"x" * (int(payload.get("mib", 1)) * MIB))
    return sum(len(b) for b in _leaked)


@recorded
def flaky(payload: Payload) -> dict[str, int]:
    """Raise RuntimeError until the job's attempt reaches ``succeed_on`` (default 2)."""
    attempt = current_job().attempt
    succeed_on = int(payload.get("succeed_on", 2))
    if attempt < succeed_on:
        raise RuntimeError(f"flaky: attempt {attempt} < {succeed_on}")
    return {"attempt": attempt}


@recorded
def downstream(payload: Payload) -> Any:
    """A slow downstream call: sleep ``seconds`` (default 0.1).

    With ``lock_dir`` and ``slots``, first take one of ``slots`` flock()ed files in that folder
    (a semaphore shared by every process on the host: a rate-limited service). ``waited`` in
    the log line is how long it had to wait for a slot: with the pool's ``max_inflight`` equal
    to ``slots`` it stays 0 unless the fleet-wide cap was exceeded. The kernel drops a flock
    when its holder dies, so a killed worker never keeps a slot.
    """
    seconds = float(payload.get("seconds", 0.1))
    lock_dir, slots = payload.get("lock_dir"), int(payload.get("slots", 0))
    if not lock_dir or slots <= 0:
        time.sleep(seconds)
        return _With(None)
    with _semaphore(Path(lock_dir), slots) as (slot, waited):
        time.sleep(seconds)
    return _With(None, slot=slot, waited=round(waited, 6))


@contextlib.contextmanager
def _semaphore(folder: Path, slots: int) -> Iterator[tuple[int, float]]:
    """Hold one of ``slots`` lock files; yield (slot, seconds waited)."""
    start = time.monotonic()
    fds = []
    try:
        for n in range(slots):
            fds.append(os.open(folder / f"slot-{n}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666))
        while True:
            for n, fd in enumerate(fds):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield n, time.monotonic() - start
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                return
            time.sleep(0.005)
    finally:
        for fd in fds:
            os.close(fd)


@recorded
def stubborn(payload: Payload) -> float:
    """Ignore SIGTERM, then sleep ``seconds`` (default 1): only a SIGKILL ends it early.
    Under a drain it runs into the grace period's end, where its worker is killed and the job
    released."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    seconds = float(payload.get("seconds", 1.0))
    time.sleep(seconds)
    return seconds


# ---- hostile ---------------------------------------------------------------------------


def gradual_bomb(payload: Payload) -> int:
    """Allocate and touch ``chunk_mib`` (50) MiB every ``interval`` (50 ms) toward ``max_mib``
    (4096): the RSS watchdog's case."""
    _started(payload)
    chunk = int(payload.get("chunk_mib", 50)) * MIB
    interval = float(payload.get("interval", 0.05))
    total = int(payload.get("max_mib", 4096)) * MIB
    held = []
    while len(held) * chunk < total:
        held.append(b"x" * chunk)  # a memset: every page resident, not just reserved
        time.sleep(interval)
    return len(held) * chunk


def instant_bomb(payload: Payload) -> int:
    """``bytearray(gib GiB)`` at once (default 8): the memory rlimit's case."""
    _started(payload)
    return len(bytearray(int(payload.get("gib", 8)) * GIB))


def hang(payload: Payload) -> None:
    """Sleep forever (until the supervisor kills the worker at the job's timeout)."""
    _started(payload)
    while True:
        time.sleep(3600)


def crash_exit(payload: Payload) -> None:
    """End the worker with ``os._exit(code)`` (default 3) in the middle of the job."""
    _started(payload)
    os._exit(int(payload.get("code", 3)))


def crash_segv(payload: Payload) -> None:
    """Die of SIGSEGV: a signal to itself, then a NULL read if that was somehow survived."""
    _started(payload)
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGSEGV)
    ctypes.string_at(0)


def crash_sigkill(payload: Payload) -> None:
    """SIGKILL of itself: what the kernel's OOM killer or an operator looks like."""
    _started(payload)
    os.kill(os.getpid(), signal.SIGKILL)


NPROC_CEILING = 1024  # fork_bomb refuses to run under a larger RLIMIT_NPROC than this


def fork_bomb(payload: Payload) -> None:
    """A fork bomb, contained only by RLIMIT_NPROC: every process forks as fast as it may.

    It refuses to start (``workers.Permanent``: dead at once, nothing forked) unless
    RLIMIT_NPROC is at most ``max_nproc`` (default 1024) and the process is not root (root and
    CAP_SYS_RESOURCE ignore RLIMIT_NPROC): the pool must set ``nproc_limit`` and a ``user``.
    The worker itself never returns (a hang: the job's timeout ends it, and the kill of the
    worker's process group takes every fork with it). Each forked process exits by itself
    ``hold`` seconds (default 10) after the job started, so a bomb orphaned by a SIGKILLed
    supervisor does not outlive the run; at the limit (EAGAIN) a process naps ``nap`` seconds
    (default 0.01) so a two-core host stays usable.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    ceiling = int(payload.get("max_nproc", NPROC_CEILING))
    if os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft > ceiling:
        raise Permanent(
            f"fork_bomb refused: uid {os.geteuid()}, RLIMIT_NPROC {soft} (needs a non-root "
            f"user and nproc_limit <= {ceiling})"
        )
    _started(payload)
    deadline = time.time() + float(payload.get("hold", 10.0))
    nap = float(payload.get("nap", 0.01))
    while True:
        _reap()
        try:
            pid = os.fork()
        except OSError:  # EAGAIN at the limit
            time.sleep(nap)
            continue
        if pid == 0:
            try:  # never unwind into the worker's own code: this process is not the worker
                _bomb(deadline, nap)
            finally:
                os._exit(0)


def _bomb(deadline: float, nap: float) -> None:
    """A forked process of ``fork_bomb``: fork until ``deadline``; every child does the same."""
    while time.time() < deadline:
        _reap()
        try:
            os.fork()  # the parent and the new child both go round again
        except OSError:
            time.sleep(nap)


def _reap() -> None:
    """Collect exited children without waiting: zombies count against RLIMIT_NPROC."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
