"""``Loop``: the parent's one reactor. It waits on every fd at once (the signal wake-up pipe,
worker sockets, the store's wake-up fd, the metrics socket) or until the next timer, and hands
back what is ready. It knows nothing about jobs.

Signals: ``signal.set_wakeup_fd`` makes the C-level handler write the signal number to a pipe
the selector watches, so a signal that arrives while we block in ``select`` wakes us at once.
The Python-level handlers only append to ``pending_signals`` (no logging, no I/O, no locks):
the loop turns them into intents. One thread owns everything here.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
from collections.abc import Callable, Iterable
from typing import Any

Callback = Callable[[], None]


class Loop:
    """A selector plus a signal wake-up pipe. Owned by the supervisor's main thread."""

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.pending_signals: list[int] = []  # appended by handlers, drained by the loop
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wakeups)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, self._record)

    def _record(self, signum: int, _frame: Any) -> None:
        # A signal handler only records. Everything else happens in the loop.
        self.pending_signals.append(signum)

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def watch(self, fd: int, callback: Callback) -> None:
        """Call ``callback`` whenever ``fd`` is readable."""
        self.selector.register(fd, selectors.EVENT_READ, callback)

    def watch_write(self, fd: int, callback: Callback) -> None:
        """Call ``callback`` whenever ``fd`` is writable (a response the kernel did not take
        at once). ``unwatch`` ends it; an fd is watched for reading or writing, not both."""
        self.selector.register(fd, selectors.EVENT_WRITE, callback)

    def unwatch(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(fd)

    def wait(self, timeout: float) -> None:
        """Block until an fd is ready, a signal arrives, or ``timeout`` seconds pass; run the
        ready fds' callbacks."""
        try:
            events = self.selector.select(max(0.0, timeout))
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            return
        for key, _ in events:
            key.data()

    def take_signals(self) -> list[int]:
        taken, self.pending_signals = self.pending_signals, []
        return taken

    def fds_for_child(self) -> list[int]:
        """Descriptors a forked worker must close: the selector's and the wake-up pipe."""
        return [self.selector.fileno(), self._wake_r, self._wake_w]

    def reset_in_child(self) -> None:
        """In a freshly forked worker: forget the parent's signal plumbing."""
        signal.set_wakeup_fd(-1)
        for fd in self.fds_for_child():
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        self.selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
