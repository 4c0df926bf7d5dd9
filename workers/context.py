"""The running job as a handler sees it: ``current_job()``.

The child runtime binds a frozen ``JobContext`` around each handler call. A worker runs one job
at a time, so besides the ``contextvars`` variable the runtime also keeps a process-wide copy:
that is what makes ``current_job()`` work in threads the handler starts (new threads begin with
an empty ``contextvars`` context, so the variable alone would not reach them).
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass


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
        anyway, and whatever the job then returns or raises, it ends cancelled."""
        return _cancel_requested and _process_job is self


_CURRENT: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "fleetd_current_job", default=None
)
# The process-wide copy (see the module docstring). Written only by the runtime's main thread.
_process_job: JobContext | None = None
# Set by the runtime's CANCEL_SIGNAL handler (it only sets this flag), cleared at each bind.
_cancel_requested = False


def note_cancel(signum: int = 0, frame: object = None) -> None:
    """The signal handler for the parent's cancel: only records it."""
    global _cancel_requested
    _cancel_requested = True


def current_job() -> JobContext:
    """The job this worker is running. Raises RuntimeError outside a job."""
    ctx = _CURRENT.get() or _process_job
    if ctx is None:
        raise RuntimeError("current_job() called outside a job (no fleetd job is running here)")
    return ctx


def bind(ctx: JobContext) -> contextvars.Token[JobContext | None]:
    """Make ``ctx`` the current job (the runtime calls this around each handler call)."""
    global _process_job, _cancel_requested
    _process_job = ctx
    _cancel_requested = False  # a cancel meant for the job before does not carry over
    return _CURRENT.set(ctx)


def unbind(token: contextvars.Token[JobContext | None]) -> None:
    """Undo ``bind``: after this, ``current_job()`` raises again."""
    global _process_job
    _process_job = None
    _CURRENT.reset(token)
