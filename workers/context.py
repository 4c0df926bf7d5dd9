"""The running job as a handler sees it: ``current_job()``.

The child runtime binds a frozen ``JobContext`` around each handler call. A worker of one
slot runs one job at a time, so besides the ``contextvars`` variable the runtime also keeps a
process-wide copy: that is what makes ``current_job()`` work in threads the handler starts (new
threads begin with an empty ``contextvars`` context, so the variable alone would not reach them).

A worker with slots (workers/slots.py) runs several jobs at once, each in a thread or an asyncio
task of its own, and binds each in that context only. What it cannot do: a thread the handler
starts itself does not see its job (run it with ``contextvars.copy_context().run``; asyncio
tasks the handler creates inherit the context and do see it).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.protocol import CancelSlot


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a handler may know about its job.

    ``attempt`` is 1 on the first delivery and equals the job's ``attempts`` column.
    ``deadline`` is the Unix time at which the supervisor will kill the job.
    """

    id: int
    kind: str
    attempt: int
    deadline: float
    pool: str

    def remaining(self) -> float:
        """Seconds left before the deadline (negative once it has passed)."""
        return self.deadline - time.time()

    @property
    def cancel_requested(self) -> bool:
        """True once an operator cancelled this job (``fleetd cancel``): a long loop may
        check it and stop early. The supervisor SIGKILLs the worker a short grace later
        anyway, and whatever the job then returns or raises, it ends cancelled. Only the job
        the cancel named: a late signal meant for the job before it does not count."""
        if self.id in slot_cancelled and _slot_jobs.get(self.id) is self:
            return True
        return _cancelled == self.id and _process_job is self


# Slots (workers/slots.py): several jobs run at once, one per thread or asyncio task, each
# bound in its own context only; the process-wide copy stays None. Cancels are kept per job:
# ids of the running slot jobs, and those the parent's CANCEL_SIGNAL named. Written by the
# slot threads and the signal handler (main thread) under the GIL: single dict/set operations.
_slot_jobs: dict[int, JobContext] = {}
slot_cancelled: set[int] = set()
# called with a job id when a cancel names a running slot job (the asyncio runner cancels
# its task); set by workers/slots.py
on_slot_cancel: Callable[[int], None] | None = None

_CURRENT: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "fleetd_current_job", default=None
)
# The process-wide copy (see the module docstring). Written only by the runtime's main thread.
_process_job: JobContext | None = None
# The id of the job the parent's CANCEL_SIGNAL named, once that job runs here (set by the
# handler, or at bind for a signal that came just before the job started); None otherwise.
_cancelled: int | None = None
# Where the parent writes the id of the job it cancels (the runtime sets it after the fork).
_slot: CancelSlot | None = None


def use_cancel_slot(slot: CancelSlot | None) -> None:
    """The runtime hands over the page the parent writes cancelled job ids to."""
    global _slot
    _slot = slot


def note_cancel(signum: int = 0, frame: object = None) -> None:
    """The signal handler for the parent's cancel: if it names the job running here, record
    it and SIGTERM the job's own processes (the worker's group; the worker ignores SIGTERM).
    A signal for a job that ended (the next one of a pipeline runs now) does nothing."""
    global _cancelled
    if _slot_jobs:
        _note_slot_cancel()
        return
    job = _process_job
    if job is None or _slot is None or _slot.read() != job.id or _cancelled == job.id:
        return
    _cancelled = job.id
    if os.getpgrp() == os.getpid():  # its own group (fork_worker): never the parent's
        with contextlib.suppress(OSError):
            os.killpg(os.getpid(), signal.SIGTERM)


def _note_slot_cancel() -> None:
    """A cancel in a worker with slots: flag the named job if it runs in a slot. No SIGTERM
    to the worker's group: its other slots' processes are in it too."""
    wanted = _slot.read() if _slot is not None else 0
    if wanted in _slot_jobs and wanted not in slot_cancelled:
        slot_cancelled.add(wanted)
        if on_slot_cancel is not None:
            on_slot_cancel(wanted)


def bind_slot(ctx: JobContext) -> contextvars.Token[JobContext | None]:
    """Make ``ctx`` the current job of this thread (or asyncio task) only: a worker with
    slots runs several at once. A cancel signalled before it started counts."""
    _slot_jobs[ctx.id] = ctx
    if _slot is not None and _slot.read() == ctx.id:
        slot_cancelled.add(ctx.id)
    return _CURRENT.set(ctx)


def unbind_slot(ctx: JobContext, token: contextvars.Token[JobContext | None]) -> None:
    """Undo ``bind_slot``."""
    _slot_jobs.pop(ctx.id, None)
    slot_cancelled.discard(ctx.id)
    _CURRENT.reset(token)


def current_job() -> JobContext:
    """The job this worker is running. Raises RuntimeError outside a job."""
    ctx = _CURRENT.get() or _process_job
    if ctx is None:
        raise RuntimeError("current_job() called outside a job (no fleetd job is running here)")
    return ctx


def bind(ctx: JobContext) -> contextvars.Token[JobContext | None]:
    """Make ``ctx`` the current job (the runtime calls this around each handler call)."""
    global _process_job, _cancelled
    _process_job = ctx
    # a cancel meant for the job before does not carry over; one for this job signalled
    # before it started (the handler found no job, or the last one) counts
    _cancelled = ctx.id if _slot is not None and _slot.read() == ctx.id else None
    return _CURRENT.set(ctx)


def unbind(token: contextvars.Token[JobContext | None]) -> None:
    """Undo ``bind``: after this, ``current_job()`` raises again."""
    global _process_job
    _process_job = None
    _CURRENT.reset(token)
