"""How a worker ends and what it says on the way: ``WorkerExit`` unwinds to ``runtime.main``,
which flushes the handler's output (``flush_stdio``) and leaves through ``os._exit``; ``say``
writes the worker's own lines on stderr."""

from __future__ import annotations

import contextlib
import os
import sys

from workers import logs
from workers.spec import WorkerSpec


class WorkerExit(Exception):
    """Unwind to ``runtime.main`` and exit with ``code``, saying ``why`` on stderr when given."""

    def __init__(self, code: int, why: str | None = None) -> None:
        super().__init__(code, why)
        self.code = code
        self.why = why


def flush_stdio() -> None:
    """Flush the handler's buffered output: ``os._exit`` would drop it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def say(spec: WorkerSpec, text: str, level: str = "WARNING", exc: str | None = None) -> None:
    """One unbuffered line on stderr, prefixed with the worker's name (and a traceback
    after it): a JSON object where the fleet logs JSON (``log_format = "json"``: every line
    of its log is one; the traceback as ``exc``, as the supervisor's own lines carry it)."""
    name = f"worker {spec.pool}#{spec.slot} (pid {os.getpid()})"
    if logs.json_lines:
        line = logs.json_line(level, "fleetd.worker", f"{name}: {text}", exc) + "\n"
    else:
        line = f"fleetd {name}: {text}\n" + (exc or "")
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", "replace"))
