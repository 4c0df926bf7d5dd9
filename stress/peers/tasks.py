"""The job bodies every queue in ``python -m stress bench`` runs: plain functions of keyword
arguments, wrapped by each peer's own task decorator (or fleetd handler) in its module.

One body for every peer, so a difference between two rows is the queue's, not the job's.
Each body reports to the harness by appending lines to a *marker file* (``marker``), one
``os.write`` on an O_APPEND fd per line so concurrent workers never interleave::

    <event> <tag> <pid> <time.time()>

The harness reads completions, pickup times, heartbeats and memory progress from that file,
the same way for every peer, instead of trusting each queue's own bookkeeping.
"""

from __future__ import annotations

import os
import time

MIB = 1024 * 1024
HOST_CAP_MIB = 3072  # a bomb never holds more than this, whatever it is asked: guards the host


def mark(marker: str, event: str, tag: str = "-") -> None:
    """Append one ``event tag pid time`` line to the marker file in a single write."""
    line = f"{event} {tag} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def noop(marker: str, tag: str = "-") -> None:
    """Does nothing but say it is done: measures the queue's own cost per job."""
    mark(marker, "done", tag)


def pickup(marker: str, tag: str) -> None:
    """Records when it started: pickup latency is this minus the time of the enqueue call."""
    mark(marker, "start", tag)


def burn(marker: str, loops: int, tag: str = "-") -> None:
    """A fixed amount of CPU (``loops`` iterations, calibrated by the harness to ~20 ms): a
    fixed loop rather than a fixed time, so a slower worker takes longer, as real work does."""
    x = 0
    for i in range(loops):
        x += i
    mark(marker, "done", tag)
    del x  # no result: every peer would store or log one differently


def bomb(
    marker: str,
    tag: str = "bomb",
    chunk_mib: int = 50,
    interval: float = 0.05,
    max_mib: int = 4096,
) -> None:
    """A gradual memory bomb: ``chunk_mib`` touched MiB every ``interval`` s toward
    ``max_mib``, reporting each step (``mem``, the MiB held in the tag). It stops at
    ``HOST_CAP_MIB`` (``cap`` line), frees everything and returns, so a queue with no memory
    limit cannot take the machine down: a ``cap`` line means nothing stopped it."""
    mark(marker, "start", tag)
    held: list[bytes] = []
    limit = min(max_mib, HOST_CAP_MIB)
    while (len(held) + 1) * chunk_mib <= limit:
        held.append(b"x" * (chunk_mib * MIB))  # a memset: every page resident
        mark(marker, "mem", f"{tag}:{len(held) * chunk_mib}")
        time.sleep(interval)
    mark(marker, "cap", tag)
    held.clear()


def beating(marker: str, tag: str, seconds: float, beat: float = 0.1) -> None:
    """Sleep ``seconds`` in ``beat`` steps, a ``beat`` line each: the harness sees exactly when
    the job stopped. ``end`` when it ran to the end; ``exit`` with the exception's name when
    something raised into it (a time limit that raises, a shutdown)."""
    mark(marker, "start", tag)
    deadline = time.time() + seconds
    try:
        while time.time() < deadline:
            time.sleep(beat)
            mark(marker, "beat", tag)
    except BaseException as exc:
        mark(marker, "exit", f"{tag}:{type(exc).__name__}")
        raise
    mark(marker, "end", tag)


def hang(marker: str, tag: str = "hang", seconds: float = 60.0) -> None:
    """A job that does not return for ``seconds`` (60: longer than any observation window, and
    still bounded so nothing outlives the run): the time limit's case."""
    beating(marker, tag, seconds)


def long(marker: str, tag: str = "long", seconds: float = 30.0) -> None:
    """A long, well-behaved job (30 s by default): the job in flight during a SIGTERM drain."""
    beating(marker, tag, seconds)


def short(marker: str, tag: str, seconds: float = 1.0) -> None:
    """A short job queued behind the long one in a drain: ``start`` and ``end`` lines."""
    beating(marker, tag, seconds, beat=seconds)


def crash(marker: str, tag: str = "crash", code: int = 3) -> None:
    """Ends its process with ``os._exit(code)`` mid-job: no exception, no cleanup."""
    mark(marker, "start", tag)
    os._exit(code)


TASKS = ("noop", "pickup", "burn", "bomb", "hang", "long", "short", "crash")
