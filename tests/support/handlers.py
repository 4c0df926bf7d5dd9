"""Test handlers, usable from a fleet.toml as ``"tests.support.handlers:echo"`` and so on.

Every handler takes the job's payload (a JSON object). With ``"log": "/path"`` in the payload,
a handler appends one JSON line to that file when it finishes (normally or by raising)::

    {"job": 12, "attempt": 1, "pid": 4242, "kind": "sleep", "start": 1.7e9, "end": 1.7e9,
     "outcome": "ok"}

Handlers that end the process or never return (crash_exit, segfault, hang) write their line
first, with ``"end": null``. Each line is one ``write`` on a file opened with O_APPEND, so
lines from concurrent workers do not interleave.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from workers import Permanent, current_job, protocol

MIB = 1024 * 1024
GIB = 1024 * MIB

Payload = dict[str, Any]
_leaked: list[bytes] = []  # what ``leak`` keeps, for the life of the worker
_cache: list[bytes] = []  # what ``warm_cache`` loaded, once per worker


def record(payload: Payload, start: float, end: float | None, outcome: str) -> None:
    """Append this execution's line to ``payload["log"]``, if given (one write call)."""
    path = payload.get("log") if isinstance(payload, dict) else None
    if not path:
        return
    ctx = current_job()
    line = {
        "job": ctx.id,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
        "kind": ctx.kind,
        "start": start,
        "end": end,
        "outcome": outcome,
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def recorded(fn: Callable[[Payload], Any]) -> Callable[[Payload], Any]:
    """Decorator: ``record`` one line when ``fn`` returns or raises."""

    @functools.wraps(fn)
    def wrapper(payload: Payload) -> Any:
        start = time.time()
        try:
            result = fn(payload)
        except BaseException:
            record(payload, start, time.time(), "raised")
            raise
        record(payload, start, time.time(), "ok")
        return result

    return wrapper


@recorded
def noop(payload: Payload) -> None:
    """Do nothing."""


@recorded
def echo(payload: Payload) -> Payload:
    """Return the payload."""
    return payload


@recorded
def sleep(payload: Payload) -> float:
    """Sleep ``payload["seconds"]`` (``payload["first_seconds"]`` on the first attempt, when
    given: a run that is sure to be cut short, then a quick one); return it."""
    seconds = float(payload.get("seconds", 1.0))
    if current_job().attempt == 1 and "first_seconds" in payload:
        seconds = float(payload["first_seconds"])
    time.sleep(seconds)
    return seconds


@recorded
def fail_until(payload: Payload) -> dict[str, int]:
    """Raise RuntimeError until the attempt reaches ``payload["succeed_on"]``."""
    attempt = current_job().attempt
    if attempt < int(payload["succeed_on"]):
        raise RuntimeError(f"flaky: attempt {attempt} < {payload['succeed_on']}")
    return {"attempt": attempt}


@recorded
def permanent(payload: Payload) -> None:
    """Raise ``workers.Permanent`` (dead-lettered at once)."""
    raise Permanent(payload.get("message", "this job can never succeed"))


@recorded
def boom(payload: Payload) -> None:
    """Raise ValueError with ``payload["message"]``."""
    raise ValueError(payload.get("message", "boom"))


def crash_exit(payload: Payload) -> None:
    """End the worker with ``os._exit(payload.get("code", 3))``."""
    record(payload, time.time(), None, "exit")
    os._exit(int(payload.get("code", 3)))


def segfault(payload: Payload) -> None:
    """Die of SIGSEGV (a signal to itself; a NULL read if that was somehow survived)."""
    record(payload, time.time(), None, "segfault")
    os.kill(os.getpid(), signal.SIGSEGV)
    ctypes.string_at(0)


def hang(payload: Payload) -> None:
    """Sleep forever (until the supervisor kills the worker)."""
    record(payload, time.time(), None, "hang")
    while True:
        time.sleep(3600)


def hang_past_the_alarm(payload: Payload) -> None:
    """Sleep forever with the worker's own deadline alarm ignored: with the supervisor's kill
    disabled too (``--no-kill``, tests/support/hooked_start.py), a worker that cannot be
    stopped, as one stuck in uninterruptible sleep would be."""
    from workers.limits import DEADLINE_SIGNAL

    signal.signal(DEADLINE_SIGNAL, signal.SIG_IGN)
    hang(payload)


def hang_with_cleanup(payload: Payload) -> None:
    """Sleep forever, but write ``payload["cleanup"]`` from a ``finally`` block: shows that a
    soft timeout lets the handler clean up before the worker is killed."""
    record(payload, time.time(), None, "hang")
    try:
        while True:
            time.sleep(3600)
    finally:
        with open(payload["cleanup"], "w") as marker:
            marker.write(str(os.getpid()))


@recorded
def instant_bomb(payload: Payload) -> int:
    """Allocate ``payload.get("gib", 8)`` GiB at once: ``bytearray(8 GiB)``."""
    return len(bytearray(int(payload.get("gib", 8)) * GIB))


@recorded
def gradual_bomb(payload: Payload) -> int:
    """Allocate and touch 50 MiB every 50 ms up to 4 GiB (each value from the payload),
    after ``delay`` seconds; with ``announce``, record the start first (a kill leaves no end)."""
    if payload.get("announce"):
        record(payload, time.time(), None, "started")
    time.sleep(float(payload.get("delay", 0.0)))
    chunk = int(payload.get("chunk_mib", 50)) * MIB
    interval = float(payload.get("interval", 0.05))
    total = int(payload.get("max_mib", 4096)) * MIB
    held = []
    while len(held) * chunk < total:
        held.append(b"x" * chunk)  # a memset, so every page is resident, not just reserved
        time.sleep(interval)
    return len(held) * chunk


@recorded
def allocate(payload: Payload) -> int:
    """Touch ``payload["mib"]`` MiB, free it and return; the job's peak RSS includes it."""
    block = b"x" * (int(payload.get("mib", 100)) * MIB)
    return len(block)


@recorded
def allocate_in_thread(payload: Payload) -> int:
    """``allocate`` in a thread that then ends (the kernel keeps an ended thread's peak)."""
    sizes: list[int] = []
    thread = threading.Thread(target=lambda: sizes.append(allocate(payload)))
    thread.start()
    thread.join()
    return sizes[0]


@recorded
def warm_cache(payload: Payload) -> int:
    """Load ``payload["mib"]`` touched MiB once per process (a model, a cache) and keep it."""
    if not _cache:
        _cache.append(b"x" * (int(payload.get("mib", 10)) * MIB))
    return len(_cache[0])


@recorded
def leak(payload: Payload) -> int:
    """Append ``payload["mib"]`` touched MiB to a module-level list; return the total kept."""
    _leaked.append(b"x" * (int(payload.get("mib", 10)) * MIB))
    return sum(len(b) for b in _leaked)


@recorded
def fork_children(payload: Payload) -> int:
    """Fork ``payload["n"]`` children that exit at once; return how many were forked.

    Under RLIMIT_NPROC the fork that goes over raises BlockingIOError (EAGAIN).
    """
    for _ in range(int(payload.get("n", 1))):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return int(payload.get("n", 1))


@recorded
def whoami(payload: Payload) -> dict[str, Any]:
    """The worker's pid, ids, job context and title, for tests of the runtime itself."""
    ctx = current_job()
    with open("/proc/self/cmdline", "rb") as f:
        title = f.read().split(b"\0")[0].decode()
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "job": ctx.id,
        "kind": ctx.kind,
        "attempt": ctx.attempt,
        "deadline": ctx.deadline,
        "pool": ctx.pool,
        "title": title,
        # what the threads and programs it starts inherit blocked
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    }


@recorded
def inheritable_fds(payload: Payload) -> dict[str, str]:
    """The worker's descriptors a program its job execs would inherit (no close-on-exec),
    beyond stdin, stdout and stderr: fd -> what it is."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    out[name] = os.readlink(f"/proc/self/fd/{name}")
            except OSError:  # the listing's own descriptor, closed by now
                continue
    return out


@recorded
def unserialisable(payload: Payload) -> object:
    """Return a set, which JSON cannot carry."""
    return {1, 2, 3}


@recorded
def balloon(payload: Payload) -> int:
    """A memory bomb caught in flight: touch ``payload["step_mib"]`` (16) MiB every
    ``payload["interval"]`` (0.1) s up to ``payload["mib"]`` MiB, then hold it for
    ``payload["hold"]`` seconds (for views that must show a worker near its memory limit)."""
    step = int(payload.get("step_mib", 16)) * MIB
    held = []
    while len(held) * step < int(payload.get("mib", 200)) * MIB:
        held.append(b"x" * step)
        time.sleep(float(payload.get("interval", 0.1)))
    time.sleep(float(payload.get("hold", 10.0)))
    return len(held) * step


@recorded
def sized(payload: Payload) -> str:
    """Return a string of ``payload["chars"]`` characters (a result of that size)."""
    return "x" * int(payload.get("chars", 0))


# ---- hostile output: what a handler raises or returns is input to the supervisor ----


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


@recorded
def hostile(payload: Payload) -> Any:
    """Raise or return what a database cannot take as it is, by ``payload["how"]``:
    ``raise_nul``, ``return_nul``, ``raise_huge`` (a 20 MiB message), ``raise_surrogate``,
    ``return_surrogate``, ``raise_unprintable`` (an exception whose ``str()`` raises)."""
    how = payload["how"]
    if how == "raise_nul":
        raise ValueError("bad\x00byte")
    if how == "return_nul":
        return {"text": "a\x00b", "k\x00ey": ["\x00"]}
    if how == "raise_huge":
        raise ValueError("x" * (20 * MIB))
    if how == "raise_surrogate":
        raise ValueError("lone \udc80 surrogate")
    if how == "return_surrogate":
        return {"text": "lone \ud800 surrogate"}
    if how == "raise_unprintable":
        raise _UnprintableError()
    raise ValueError(f"unknown how {how!r}")


def result_then_garbage(payload: Payload) -> None:
    """Write, in one write on the worker's connection to its parent, this job's ``JobDone``
    (result ``{"written": "by the handler"}``) and then a frame that is not JSON; then end
    the worker (exit 3), as one whose stream broke would. The connection is the worker's one
    socket past stdio."""
    sockets = [
        int(name)
        for name in os.listdir("/proc/self/fd")
        if int(name) > 2 and _is_socket(f"/proc/self/fd/{name}")
    ]
    if len(sockets) != 1:
        raise RuntimeError(f"not one socket past stdio: {sockets}")
    done = protocol.JobDone(current_job().id, '{"written": "by the handler"}', 0.0, None)
    garbage = protocol.HEADER.pack(5) + b"nope!"
    record(payload, time.time(), None, "exit")
    os.write(sockets[0], protocol.encode(done) + garbage)
    os._exit(3)


def _is_socket(path: str) -> bool:
    try:
        return os.readlink(path).startswith("socket:")
    except OSError:  # the listing's own fd, closed by now
        return False


@recorded
def until_cancelled(payload: Payload) -> dict[str, Any]:
    """Work in a loop that looks at ``current_job().cancel_requested`` and stops early (a
    cooperative stop); otherwise run ``seconds`` (default 60)."""
    ctx = current_job()
    end = time.monotonic() + float(payload.get("seconds", 60))
    while time.monotonic() < end:
        if ctx.cancel_requested:
            return {"stopped": True}
        time.sleep(0.005)
    return {"stopped": False}


def gc_copies(payload: Payload) -> Payload:
    """Run a full collection and report how many KiB of this worker's pages it made private
    (the parent's objects it walked and wrote to, copy-on-write)."""
    import gc

    def private_kib() -> int:
        with open("/proc/self/smaps_rollup") as f:
            return sum(int(line.split()[1]) for line in f if line.startswith("Private_"))

    before = private_kib()
    gc.collect()
    return {"copied_kib": private_kib() - before}


@recorded
def fail_while(payload: Payload) -> str:
    """Raise while the file ``payload["flag"]`` exists: a fault an operator fixes (removes
    the file) before requeueing the dead job."""
    if os.path.exists(payload["flag"]):
        raise RuntimeError(f"{payload['flag']} is still there")
    return "fixed"


# ---- slots (workers/slots.py) ----


def slot_sleep(payload: Payload) -> dict[str, Any]:
    """Sleep ``seconds`` (``first_seconds`` on the first attempt, when given); say which
    worker and job ran it, as ``current_job()`` sees it in its slot."""
    seconds = float(payload.get("seconds", 1.0))
    if current_job().attempt == 1 and "first_seconds" in payload:
        seconds = float(payload["first_seconds"])
    time.sleep(seconds)
    ctx = current_job()
    return {"pid": os.getpid(), "job": ctx.id, "attempt": ctx.attempt}


async def async_sleep(payload: Payload) -> dict[str, Any]:
    """``slot_sleep`` as an ``async def`` handler (a task on the worker's event loop)."""
    import asyncio

    seconds = float(payload.get("seconds", 1.0))
    if current_job().attempt == 1 and "first_seconds" in payload:
        seconds = float(payload["first_seconds"])
    await asyncio.sleep(seconds)
    ctx = current_job()
    return {"pid": os.getpid(), "job": ctx.id, "attempt": ctx.attempt}


async def async_stubborn(payload: Payload) -> None:
    """An ``async def`` handler that swallows every cancellation and keeps waiting: only
    the supervisor's kill ends it."""
    import asyncio

    while True:
        try:
            await asyncio.sleep(1000)
        except asyncio.CancelledError:
            continue


def slot_cancel_wait(payload: Payload) -> dict[str, Any]:
    """Wait until ``current_job().cancel_requested`` (then return), at most ``seconds``."""
    end = time.monotonic() + float(payload.get("seconds", 30.0))
    while time.monotonic() < end:
        if current_job().cancel_requested:
            return {"stopped": True}
        time.sleep(0.01)
    return {"stopped": False}
