"""A handler call and what it produced: a result, or a classified failure.

``call`` never raises. A failure gets an ``error_kind`` the parent understands: ``permanent``
for ``workers.Permanent``; ``memory_limit`` when an allocation was refused (``MemoryError``, or
``OSError`` ENOMEM as ``mmap`` raises it, anywhere in the exception's cause/context chain, so a
library that wraps the MemoryError in its own error still counts); ``exception`` otherwise.

What it cannot do: a library that handles a refused allocation by exiting or hanging (OpenBLAS
does both, see docs/memory-limits.md) never gets here; the parent sees a crash or a timeout.
"""

from __future__ import annotations

import errno
import gc
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers import protocol
from workers.errors import Permanent, SoftTimeout, one_line

TAIL_FRAMES = 6  # traceback frames kept in JobFailed.traceback_tail
MAX_TEXT = 4000  # characters kept of a message or a traceback tail


@dataclass
class Outcome:
    """What a handler call produced: a result, or an error kind with message and tail."""

    result: Any = None
    error_kind: str | None = None  # None: success
    message: str = ""
    tail: str = ""
    duration: float = 0.0  # seconds in the handler
    child_peak: int = 0  # bytes: peak RSS of a command handler's program (its rusage)


def call(handler: Callable[[Any], Any], payload: Any) -> Outcome:
    """Call the handler in this thread; never raises (everything becomes an ``Outcome``)."""
    start = time.monotonic()
    try:
        outcome = Outcome(result=handler(payload))
    except BaseException as exc:  # SystemExit and KeyboardInterrupt from a handler too
        outcome = failure(exc)
    outcome.duration = time.monotonic() - start
    return outcome


def failure(exc: BaseException) -> Outcome:
    """Classify and describe a handler's exception, freeing its frames first.

    After a refused allocation the handler's locals (a half-built list of chunks) may hold
    most of the worker's memory; the traceback keeps them alive. Clearing the frames releases
    them before anything else is allocated, and the tail is still formatted from the code
    objects and line numbers, which survive the clearing.
    """
    chained: BaseException | None = exc
    for _ in range(16):  # the chain's tracebacks hold the same frames; bounded against cycles
        if chained is None:
            break
        traceback.clear_frames(chained.__traceback__)  # skips our own, still running frame
        chained = chained.__cause__ or chained.__context__
    kind = _classify(exc)
    if kind == protocol.MEMORY_LIMIT:
        gc.collect()
    try:
        return Outcome(error_kind=kind, message=one_line(exc), tail=_tail(exc))
    except Exception:  # MemoryError; a broken __str__ or traceback of the handler's own
        return Outcome(error_kind=kind, message=type(exc).__name__)


def _classify(exc: BaseException) -> str:
    """permanent for ``Permanent``; memory_limit when a refused allocation is in the chain."""
    if isinstance(exc, Permanent):
        return protocol.PERMANENT
    if isinstance(exc, SoftTimeout):
        return protocol.TIMEOUT
    chained: BaseException | None = exc
    for _ in range(16):
        if chained is None:
            break
        if isinstance(chained, MemoryError) or (
            isinstance(chained, OSError) and chained.errno == errno.ENOMEM
        ):
            return protocol.MEMORY_LIMIT
        chained = chained.__cause__ or chained.__context__
    return protocol.EXCEPTION


def _tail(exc: BaseException) -> str:
    """The last frames of the traceback (the runtime's own frame left out) and the error."""
    entries = traceback.extract_tb(exc.__traceback__)[1:]
    lines = traceback.format_list(entries[-TAIL_FRAMES:])
    return ("".join(lines) + one_line(exc))[-MAX_TEXT:]
