"""Tests that run with no other test at once, while the rest of the suite runs in parallel.

A test marked ``alone`` does something no neighbour may see: it restarts the shared PostgreSQL
server, or it holds a bound (a kill within timeout + 1 s, a stall's end) that a neighbour's load
must not decide. Every test holds a shared lock for its whole run (setup, call, teardown); an
``alone`` test holds it exclusively, so it starts once the tests in flight on the other workers
have ended and none starts before it ends. The lock file belongs to one pytest-xdist run
(``PYTEST_XDIST_TESTRUNUID``): two runs on one machine do not wait for each other. In a serial
run (no xdist) nothing runs beside a test anyway, and no lock is taken.

A writer could wait for ever behind readers that keep overlapping, so a reader takes its shared
lock only after passing a gate, which the ``alone`` test holds while it waits: once it waits, no
new test starts.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

RUN_ID = "PYTEST_XDIST_TESTRUNUID"


def lock_folder() -> Path | None:
    """Where this parallel run's locks live, or None in a serial run."""
    run = os.environ.get(RUN_ID)
    if not run or not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return Path("/tmp") / f"fleetd-suite-{os.getuid()}-{run}"


class TestLock:
    """This worker's hold on the run's test lock. ``alone`` tests are one xdist group (one
    worker, one after the other), and the lock stays exclusive from one to the next, so the
    others wait for the tests in flight once, not once per ``alone`` test."""

    def __init__(self) -> None:
        self.folder = lock_folder()
        self.files: tuple[IO[str], IO[str]] | None = None
        self.alone = False

    def before(self, alone: bool) -> None:
        if self.folder is None or (self.files is not None and self.alone and alone):
            return
        self.folder.mkdir(exist_ok=True)
        # held across hook calls, closed in after()
        gate = open(self.folder / "gate", "a+")  # noqa: SIM115
        tests = open(self.folder / "tests", "a+")  # noqa: SIM115
        self.files, self.alone = (gate, tests), alone
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)  # no new test starts from here
            fcntl.flock(tests, fcntl.LOCK_EX)  # the ones in flight have ended
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(tests, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)

    def after(self, next_alone: bool) -> None:
        if self.files is None or (self.alone and next_alone):
            return
        for file in self.files:  # closing a file releases its lock
            file.close()
        self.files = None
