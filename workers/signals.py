"""A worker's signals: what it undoes of its parent's setup after the fork, and the window in
which the parent's soft-timeout signal raises ``SoftTimeout`` in a handler.

SIGINT and SIGTERM are set to SIG_IGN, and an ignored disposition survives exec: processes a
handler starts ignore them too. That keeps them running through a drain like the job itself
(systemd sends SIGTERM to every process of the unit), and the parent's SIGKILL of the worker's
process group still ends them; but ``Popen.terminate()`` will not stop them. Handlers should
use ``kill()``, or restore SIG_DFL in the subprocess.
"""

from __future__ import annotations

import _signal
import signal
from typing import Any

from workers import context, protocol
from workers.errors import SoftTimeout
from workers.handlers import Handler

# signal.pthread_sigmask turns the old mask it returns into a set of Signals members: three
# times the cost of the system call. The C function underneath does not.
_sigmask = getattr(_signal, "pthread_sigmask", signal.pthread_sigmask)

_SIGNALS = tuple(sorted(int(s) for s in signal.valid_signals()))

# What the parent's signal setup left that a worker must undo, when the parent knows it
# (``note_forkers_signals``): the signals it has Python handlers for, and whether it has a
# wake-up fd. None: not known, look (every signal: ~0.3 ms of a fresh worker's boot, measured).
_parents_signals: tuple[tuple[int, ...], bool] | None = None

_in_handler = False  # a handler runs in the main thread: the soft signal raises only then


def reset_signals() -> None:
    """Ignore SIGINT/SIGTERM; drop what the parent's signal setup left in this process.

    The parent's Python handlers refer to the parent's objects, and its wake-up fd is the
    parent's loop: a signal delivered here would write into it. A mask the parent held across
    the fork is inherited too. SIGPIPE stays ignored (Python's default), so a write to a dead
    parent raises BrokenPipeError instead of killing the worker silently.
    """
    handled, wakeup_fd = _parents_signals or (python_handled(), True)
    if wakeup_fd:
        signal.set_wakeup_fd(-1)
    for sig in handled:
        _signal.signal(sig, _signal.SIG_DFL)
    _signal.signal(signal.SIGINT, _signal.SIG_IGN)
    _signal.signal(signal.SIGTERM, _signal.SIG_IGN)
    _signal.signal(protocol.SOFT_TIMEOUT_SIGNAL, _raise_soft_timeout)
    _signal.signal(protocol.CANCEL_SIGNAL, context.note_cancel)  # sets a flag; never raises
    _sigmask(signal.SIG_SETMASK, ())


def note_forkers_signals() -> None:
    """In the forker, after its imports: drop a wake-up fd an import left (an event loop's
    self-pipe: no loop reads it there, and once full every signal would print a complaint),
    and note the signals its imports gave Python handlers. A worker forked from it then
    undoes those and no more (``reset_signals``)."""
    global _parents_signals
    signal.set_wakeup_fd(-1)
    _parents_signals = (python_handled(), False)


def python_handled() -> tuple[int, ...]:
    """The signals this process has a Python handler for."""
    handled = []
    for sig in _SIGNALS:  # the C functions: plain ints, no Signals enum per call (~0.3 ms)
        try:
            if callable(_signal.getsignal(sig)):
                handled.append(sig)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP and friends
            continue
    return tuple(handled)


def _raise_soft_timeout(signum: int, frame: object) -> None:
    if _in_handler:
        raise SoftTimeout("the job ran past its timeout; the worker is killed shortly")


def soft_timeout_window(handler: Handler) -> Handler:
    """Raise ``SoftTimeout`` for the parent's soft-timeout signal only while the handler
    itself runs.

    The signal is never blocked (a mask would be inherited by the threads and programs a
    handler starts, and opening and closing it cost three system calls a job): one that
    arrives between jobs, too late for the job it was meant for, interrupts at most a read
    or a write, which is resumed, and is ignored. One that arrives while the handler runs
    raises inside it, or in this wrapper right after it returns (Python runs signal handlers
    between bytecodes): either way within ``call``, so the job fails as ``timeout``."""

    def run(payload: Any) -> Any:
        global _in_handler
        _in_handler = True
        try:
            return handler(payload)
        finally:
            _in_handler = False

    return run
