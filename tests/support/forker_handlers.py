"""Handlers for the forker's boot tests (tests/integration/test_forker.py). Kept apart from
tests/support/handlers.py: what this module imports is what a worker that runs it holds."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

# a pool whose handlers take a while to import (a model, a big library): the forker's boot
# then outlasts a fork request's reply limit
if os.environ.get("FLEETD_TEST_SLOW_IMPORT"):
    time.sleep(float(os.environ["FLEETD_TEST_SLOW_IMPORT"]))

# only outside the supervisor (in the forker): an import that works in one process and not
# in another (a missing environment variable, a path relative to the working folder)
if os.environ.get("FLEETD_TEST_FORKER_IMPORT_FAILS") and "supervisor.config" not in sys.modules:
    raise RuntimeError("refuses to load outside the supervisor")

# a library that installs a handler at import (the forker imports it; its workers must not
# keep a handler that refers to the forker's objects)
signal.signal(signal.SIGUSR2, lambda signum, frame: None)

if "supervisor.config" not in sys.modules:  # in the forker only
    # an event loop's self-pipe left as the wake-up fd (loop.add_signal_handler does this)
    if os.environ.get("FLEETD_TEST_FORKER_WAKEUP_FD"):
        _wakeup = socket.socketpair()
        _wakeup[1].setblocking(False)
        signal.set_wakeup_fd(_wakeup[1].fileno())
    # a library's own SIGTERM handler (a graceful exit for a process of its own)
    if os.environ.get("FLEETD_TEST_FORKER_SIGTERM"):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    # a sampling profiler's timer: SIGALRM several times a second, to a Python handler
    if os.environ.get("FLEETD_TEST_FORKER_ALARM"):
        signal.signal(signal.SIGALRM, lambda signum, frame: None)
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)


def modules(payload: dict) -> dict:
    """Which of the supervisor's heavy imports this worker holds."""
    return {
        "supervisor": sorted(m for m in sys.modules if m.split(".")[0] == "supervisor"),
        "heavy": sorted(
            m for m in ("sqlalchemy", "rich", "pydantic", "click", "psycopg") if m in sys.modules
        ),
    }


def log_line(payload: dict) -> None:
    """Logs one warning, as a handler using the logging module does."""
    import logging

    logging.getLogger("app.render").warning("handler says %s", payload["n"])


def signal_state(payload: dict) -> dict:
    """This worker's dispositions and mask while its job runs, and its parent's mask."""

    def disposition(sig: int) -> str:
        handler = signal.getsignal(sig)
        return "python" if callable(handler) else signal.Handlers(handler).name

    names = ("SIGUSR1", "SIGUSR2", "SIGINT", "SIGTERM", "SIGCHLD", "SIGALRM")
    wakeup_fd = signal.set_wakeup_fd(-1)
    return {
        "dispositions": {name: disposition(getattr(signal, name)) for name in names},
        "cancel": disposition(signal.SIGRTMIN + 4),
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "wakeup_fd": wakeup_fd,
    }


def sleep(payload: dict) -> None:
    time.sleep(payload["seconds"])
