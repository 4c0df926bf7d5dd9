"""The cgroup tree's file operations, for ``run/memcg.py``: make a limited worker cgroup, read
its counters (OOM kills, peak, charge, processes), remove it, and remove what supervisors that
are gone left behind.

Reads and writes use ``os`` calls, not ``Path.read_text``: the loop reads several of these files
after every worker's end, and an io stack with a decoder took several times as long. cgroupfs
makes no file: a knob that is missing is an ``OSError``. Every function takes the mechanism
(``"v1"`` or ``"v2"``) whose file names it reads; none keeps state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from workers.scratch import pid_alive

log = logging.getLogger("fleetd.memcg")

_OURS = re.compile(r"fleetd-(?:probe-)?(\d+)")


@dataclass
class WorkerCgroup:
    """One worker's cgroup as the parent tracks it."""

    path: Path
    limit: int
    memory_limit: int
    oom_seen: int = 0  # the cgroup's oom_kill count already accounted for
    next_check: float = 0.0


def make_limited(path: Path, limit: int, version: str) -> None:
    """Create the worker cgroup ``path`` with ``limit`` (and no swap, where it can)."""
    path.mkdir(exist_ok=True)
    if version == "v2":
        write(path / "memory.max", limit)
        write(path / "memory.swap.max", 0, optional=True)
        write(path / "memory.oom.group", 1, optional=True)
    else:
        write(path / "memory.limit_in_bytes", limit)
        write(path / "memory.memsw.limit_in_bytes", limit, optional=True)


def oom_count(path: Path, version: str) -> int | None:
    """The cgroup's kernel OOM kill count; None if unreadable (a kernel before 4.13)."""
    name = "memory.events" if version == "v2" else "memory.oom_control"
    try:
        text = read(path, name).decode()
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def peak(path: Path, version: str) -> int | None:
    """The most memory ever charged to the cgroup (v1: since its last reset); None if
    unreadable."""
    name = "memory.peak" if version == "v2" else "memory.max_usage_in_bytes"
    try:
        return int(read(path, name).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def reset_peak(path: Path, version: str) -> None:
    """Reset the peak counter where the kernel allows it (v2's resets per open file only)."""
    if version == "v1":
        write(path / "memory.max_usage_in_bytes", 0, optional=True)


def charged(path: Path, version: str) -> int | None:
    """Bytes charged to the cgroup now; None if unreadable."""
    name = "memory.current" if version == "v2" else "memory.usage_in_bytes"
    try:
        return int(read(path, name))
    except (OSError, ValueError):
        return None


def remove_stale(parent: Path, own_pid: int) -> tuple[list[Path], list[Path]]:
    """Remove the ``fleetd-<pid>`` cgroups (and their worker cgroups) of supervisors that are
    no longer running: what was removed at once, and what is left to remove once empty.
    Processes still in them are what a SIGKILLed supervisor's jobs forked (PR_SET_PDEATHSIG
    reaches the worker only): their jobs' leases are held by nobody and the jobs may already
    run elsewhere, so they get SIGKILL."""
    removed: list[Path] = []
    left: list[Path] = []
    try:
        entries = [e for e in parent.iterdir() if e.is_dir() and _OURS.fullmatch(e.name)]
    except OSError:
        return removed, left
    for entry in entries:
        match = _OURS.fullmatch(entry.name)
        assert match is not None
        pid = int(match[1])
        if pid == own_pid or pid_alive(pid):
            continue
        for child in subdirs(entry):
            if remove(child):
                removed.append(child)
                continue
            leftovers = procs(child)
            for leftover in leftovers:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(leftover, signal.SIGKILL)
            log.warning(
                "killed %d process(es) a stopped fleetd's job left in %s: %s",
                len(leftovers),
                child,
                " ".join(map(str, leftovers)) or "(exiting)",
            )
            left.append(child)
        if remove(entry):
            removed.append(entry)
        else:
            left.append(entry)
    if removed:
        log.info("removed %d stale cgroup(s) of stopped supervisors", len(removed))
    return removed, left


def write(path: Path, value: int, optional: bool = False) -> None:
    """Write ``value`` to a cgroup knob; a missing or refused ``optional`` one is skipped."""
    try:
        # as ``open(path, "w")`` (cgroupfs makes no file: a missing knob is an OSError)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, b"%d" % value)
        finally:
            os.close(fd)
    except OSError:
        if not optional:  # a missing or refused optional knob (swap, oom.group) is skipped
            raise


def read(folder: Path, name: str) -> bytes:
    """A cgroup file's contents. Raises ``OSError``."""
    fd = os.open(f"{folder}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while chunks[-1]:  # cgroup.procs of a fork bomb's cgroup is longer than one read
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


def procs(path: Path) -> list[int]:
    """The pids in the cgroup (none if it is unreadable or gone)."""
    try:
        return [int(pid) for pid in read(path, "cgroup.procs").split()]
    except (OSError, ValueError):
        return []


def subdirs(path: Path) -> list[Path]:
    try:
        return [c for c in path.iterdir() if c.is_dir()]
    except OSError:
        return []


def remove(path: Path) -> bool:
    """rmdir a cgroup; True if it is gone (or never was)."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
