"""Where command jobs keep their folders, so that a worker killed mid-job leaves nothing.

::

    $TMPDIR/fleetd-<supervisor pid>/                 made by the supervisor at start
        <pool>-<slot>-<worker pid>/                  made by the worker, before its privilege drop
            fleetd-job-XXXXXXXX/                     one job's cwd, HOME and TMPDIR

A job's folder is removed by the worker when the job ends. A worker SIGKILLed mid-job (the
memory watchdog, a deadline) cannot do that: the supervisor removes the worker's directory
when it reaps the worker, and a supervisor that starts removes the ``fleetd-<pid>``
directories of supervisors that are gone (``stale``). The names are pure functions; the rest
is a few system calls.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterable

PREFIX = "fleetd-"
_SUPERVISOR_DIR = re.compile(r"fleetd-([0-9]+)")


def supervisor_dir(tmp: str, supervisor_pid: int) -> str:
    """``<tmp>/fleetd-<pid>``.

    >>> supervisor_dir("/tmp", 42)
    '/tmp/fleetd-42'
    """
    return os.path.join(tmp, f"{PREFIX}{supervisor_pid}")


def worker_dir(root: str, pool: str, slot: int, pid: int) -> str:
    """``<root>/<pool>-<slot>-<pid>`` (a path separator in the pool's name becomes ``_``).

    >>> worker_dir("/tmp/fleetd-42", "media", 3, 1234)
    '/tmp/fleetd-42/media-3-1234'
    """
    name = pool.replace(os.sep, "_").replace("\0", "_") or "_"
    return os.path.join(root, f"{name}-{slot}-{pid}")


def first_time(root: str | None, what: str) -> bool:
    """True for the first worker of this supervisor to ask about ``what`` (a marker file made
    with O_EXCL in the supervisor's directory), so a note every worker would print is printed
    once. Without the directory (it could not be made): always True."""
    if root is None:
        return True
    try:
        os.close(os.open(os.path.join(root, f".said-{what}"), os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def stale(names: Iterable[str], alive: Callable[[int], bool], own_pid: int) -> list[str]:
    """The entries of the temp directory that are a gone supervisor's ``fleetd-<pid>``
    (pure: ``alive`` says whether a pid is running)."""
    out = []
    for name in names:
        match = _SUPERVISOR_DIR.fullmatch(name)
        if match and int(match[1]) != own_pid and not alive(int(match[1])):
            out.append(name)
    return out


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_root(tmp: str, supervisor_pid: int) -> tuple[str, list[str]]:
    """The supervisor's own directory, made (mode 0711: its workers, under another user
    perhaps, may enter it but not list it), and the gone supervisors' directories removed.
    Returns the directory and those removed. Raises OSError if it cannot be made."""
    removed = []
    with contextlib.suppress(OSError):
        for name in stale(os.listdir(tmp), pid_alive, supervisor_pid):
            path = os.path.join(tmp, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    root = supervisor_dir(tmp, supervisor_pid)
    os.makedirs(root, mode=0o711, exist_ok=True)
    os.chmod(root, 0o711)
    return root, removed


def make_worker_dir(
    root: str, pool: str, slot: int, owner: tuple[int, int] | None = None
) -> str | None:
    """This worker's directory (mode 0700, owned by ``owner`` (uid, gid) when given: the
    user it is about to become). None if it cannot be made: jobs then use the default temp
    directory, and a folder of a killed worker is left there."""
    path = worker_dir(root, pool, slot, os.getpid())
    try:
        os.mkdir(path, 0o700)
        if owner is not None:
            os.chown(path, *owner)
    except OSError:
        return None
    return path


def remove(path: str) -> None:
    """Remove a worker's directory and what is in it (a local temp directory: quick). An
    empty one (the usual case: a job removes its own folder) takes one ``rmdir``, without
    ``shutil.rmtree``'s walk."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
