"""Counts forks: ``site`` imports this module at start-up in a Python whose PYTHONPATH holds
this folder (the integration tests start ``fleetd start`` that way). With
``FLEETD_TEST_FORK_LOG`` set, every ``os.fork()`` of the process appends the forking pid and
its parent's to that file, from an audit hook (the ``os.fork`` audit event is raised before
the fork), so a test can say exactly how many workers a supervisor forked, or that it forked
none.
"""

import os
import sys

_LOG = os.environ.get("FLEETD_TEST_FORK_LOG")


def _on_audit(event: str, _args: tuple) -> None:
    if event != "os.fork" or not _LOG:
        return
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {os.getppid()}\n".encode())
    finally:
        os.close(fd)


if _LOG:
    sys.addaudithook(_on_audit)
