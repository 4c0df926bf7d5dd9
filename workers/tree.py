"""A worker's process tree: the subreaper, the job's processes, their memory, their end.

The worker makes itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``, Linux 3.4): a process
a job started that loses its parent is re-parented to the worker instead of to init. So a
daemon a job leaves behind (double fork, ``setsid``) is still the worker's descendant, found by
walking ``/proc/<pid>/task/<tid>/children`` (every thread's children: a handler's thread may
start processes too), counted by the parent's watchdog, and killed when the job ends. A worker
runs one job at a time, so every descendant of a worker belongs to the job it runs.

What it cannot do:
- A process that escapes the tree (a ``setsid`` daemon whose worker was SIGKILLed goes to the
  supervisor, which is a subreaper too and kills it; if the supervisor itself is SIGKILLed
  at the same moment, it goes to init and lives on: only a cgroup holds it then).
- Walking ``/proc`` races with forks: a process forked after its parent's ``children`` file
  was read is missed by that walk. ``end_all`` walks again until a walk finds nothing.
- Threads that C code starts (not Python's ``threading``) are not looked at after a job when
  no Python thread runs besides the main one: a process such a thread started and left is
  then found only once it loses its parent (it comes to the subreaper's main thread).
- ``children`` files need ``CONFIG_PROC_CHILDREN`` (on in every mainstream kernel); without
  them the tree is the worker alone (``descendants`` returns [] and ``supports_walk`` False).

Parent and child both use it: the parent reads the tree's memory (``tree_memory``) and kills
what a dead worker left (``end_all(root=...)``). Stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
import threading
from typing import NamedTuple

from workers import limits

PR_SET_CHILD_SUBREAPER = 36
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants; False where prctl cannot."""
    c = limits.libc()
    if c is None or not hasattr(c, "prctl"):
        return False
    return c.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


# This process's main thread's ``children`` file, kept open: (pid, fd). A fork re-opens it.
_own_fd: tuple[int, int] | None = None


def _own_children() -> list[int] | None:
    """This process's children, cheaply (one pread, ~2 µs, where a full walk of the task
    folder costs ~15 µs: it runs after every job). Only when no other Python thread runs:
    a thread's children are in its own file. None: do the full walk."""
    global _own_fd
    if threading.active_count() > 1:
        return None
    pid = os.getpid()
    if _own_fd is None or _own_fd[0] != pid:
        try:
            _own_fd = (pid, os.open(f"/proc/{pid}/task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            return None
    try:
        return [int(p) for p in os.pread(_own_fd[1], 65536, 0).split()]
    except (OSError, ValueError):
        return None


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (of every thread of it); [] when it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def descendants(pid: int | None = None) -> list[int]:
    """Every descendant of ``pid`` (default: this process), parents before their children."""
    root = os.getpid() if pid is None else pid
    first = _own_children() if root == os.getpid() else None
    if first == []:
        return []
    out: list[int] = []
    todo = [root]
    seen = {root}
    while todo:
        parent = todo.pop()
        found = first if parent == root and first is not None else children(parent)
        for child in found:
            if child not in seen:  # a recycled pid cannot loop the walk
                seen.add(child)
                out.append(child)
                todo.append(child)
    return out


def supports_walk() -> bool:
    """Whether this kernel has ``/proc/<pid>/task/<tid>/children``."""
    pid = os.getpid()
    return os.path.exists(f"/proc/{pid}/task/{pid}/children")


def signal_all(pids: list[int], sig: int) -> int:
    """Send ``sig`` to each of ``pids``; how many were still there to receive it."""
    sent = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            sent += 1
    return sent


def kept_helpers() -> frozenset[int]:
    """The processes of this one that a job's end spares: multiprocessing's resource tracker,
    once a job started it (it is started once per process and serves every later job; killed,
    it warns and leaks what it tracks). Looked up without importing multiprocessing."""
    module = sys.modules.get("multiprocessing.resource_tracker")
    pid = getattr(getattr(module, "_resource_tracker", None), "_pid", None)
    return frozenset({pid}) if isinstance(pid, int) else frozenset()


def job_processes() -> list[int]:
    """This process's descendants but ``kept_helpers``: what a job's end or stop kills."""
    keep = kept_helpers()
    return [pid for pid in descendants() if pid not in keep]


def end_all(root: int | None = None, rounds: int = 8) -> int:
    """SIGKILL every descendant of ``root`` (default: this process, sparing
    ``kept_helpers``) until a walk finds none, and, for this process's own tree, reap them.
    Returns how many were killed. Bounded: a fork bomb faster than the walk is left to
    RLIMIT_NPROC and the worker's own end."""
    killed = 0
    for _ in range(rounds):
        found = job_processes() if root is None else descendants(root)
        if not found:
            break
        # stop them first, so none forks between the walk and its kill
        signal_all(found, signal.SIGSTOP)
        killed += signal_all(found, signal.SIGKILL)
        if root is None:
            reap()
    if root is None:
        reap()
    return killed


def reap() -> list[tuple[int, int]]:
    """Reap every child of this process that has exited (the job's strays adopted by the
    subreaper, and the job's own children once killed); (pid, status) of each."""
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


def process_memory(pid: int) -> int | None:
    """Proportional set size of ``pid`` in bytes (``/proc/<pid>/smaps_rollup``: shared pages
    divided among the processes that map them, so a forked child and its parent do not count
    the pages they share twice); its RSS where smaps_rollup is missing; None when gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return _statm_rss(pid)
    except OSError:
        return None
    start = data.find(b"\nPss:")
    if start < 0:
        return _statm_rss(pid)
    return int(data[start + 5 : data.index(b"kB", start)]) * 1024


def memory_split(pid: int) -> tuple[int, int] | None:
    """(private, shared) bytes of ``pid``'s resident memory, as the kernel counts them
    (``smaps_rollup``: Private_Clean + Private_Dirty, Shared_Clean + Shared_Dirty). A worker
    at rest is mostly shared pages (inherited from the supervisor at fork, resident once
    however many workers map them); its private part is what it costs the host. None when
    gone or unreadable. ~0.1 ms for a 50 MiB worker."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields: dict[bytes, int] = {}
    for line in data.splitlines():
        name, _, rest = line.partition(b":")
        if name in (b"Private_Clean", b"Private_Dirty", b"Shared_Clean", b"Shared_Dirty"):
            fields[name] = int(rest.split()[0]) * 1024
    if len(fields) < 4:
        return None
    private = fields[b"Private_Clean"] + fields[b"Private_Dirty"]
    return private, fields[b"Shared_Clean"] + fields[b"Shared_Dirty"]


def _statm_rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def tree_memory(pid: int, own: int | None) -> tuple[int | None, int]:
    """The memory of ``pid``'s whole tree: ``own`` (the root's figure, as the caller
    measures it) plus each descendant's ``process_memory``; and how many descendants there
    were. One ``children`` read per thread when the root has no descendants."""
    if own is None:
        return None, 0
    found = descendants(pid)
    total = own
    for child in found:
        total += process_memory(child) or 0
    return total, len(found)


# ---- a private /dev/shm --------------------------------------------------------------------

CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 16384, 1 << 18
SHM = "/dev/shm"


def private_shm(size: int | None) -> str | None:
    """Give this process (and what it starts) a /dev/shm of its own: a new mount namespace
    whose mounts do not propagate back, and a fresh tmpfs on /dev/shm of at most ``size``
    bytes. Files a job leaves there are then seen by no one else, removed after each job
    (``empty_shm``), and gone with the worker's last process whatever happens. Needs
    CAP_SYS_ADMIN (fleetd running as root) and a single-threaded caller; None on success,
    else why not (the worker then shares the host's /dev/shm). ~0.6 ms (21 mounts here)."""
    c = limits.libc()
    if c is None or not hasattr(c, "unshare") or not os.path.isdir(SHM):
        return "no unshare(2) or no /dev/shm here"
    if c.unshare(CLONE_NEWNS) != 0:
        return f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}"
    if c.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"making mounts private: {os.strerror(ctypes.get_errno())}"
    options = b"mode=1777" + (b",size=%d" % size if size else b"")
    if c.mount(b"tmpfs", SHM.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        return f"mounting a tmpfs on /dev/shm: {os.strerror(ctypes.get_errno())}"
    return None


class ShmBaseline(NamedTuple):
    """A worker's fresh private /dev/shm: its device, and the inodes it counts empty."""

    dev: int
    inodes: int | None  # None: the filesystem does not count them (every check lists)


def shm_baseline(where: str = SHM) -> ShmBaseline | None:
    """The device of the filesystem at ``where`` and the inodes in use there (a tmpfs spends
    one on every name in it: file, folder, link, and its root's); None if it cannot be read.
    Taken of a fresh /dev/shm, it is what an empty one counts, and which one is ours."""
    try:
        dev, st = os.stat(where).st_dev, os.statvfs(where)
    except OSError:
        return None
    return ShmBaseline(dev, st.f_files - st.f_ffree if st.f_files > 0 else None)


def shm_after_job(fresh: ShmBaseline | None, where: str = SHM, slack: int = 1 << 20) -> bool:
    """After a job, in a worker with a /dev/shm of its own: whether the job filled it (less
    than ``slack`` bytes left), with whatever the job left there removed.

    One ``statvfs`` when the job left nothing, which is nearly always: the inode count is
    still the fresh one's and no block is in use, so there is nothing to list (a listing was
    ~9 µs of every job, a fifth of what a no-op job costs its worker). Listed and emptied
    when anything is there, when blocks are in use (a file deleted but still open holds
    them), and where the counts say nothing (none kept, or a root job remounted it with
    ``nr_inodes=0,size=0``: both read 0 then). Never emptied once /dev/shm is not the
    tmpfs mounted for this worker (a root job unmounted it or mounted another over it), nor
    when ``fresh`` is None (which one is ours is not known): what is there may be the host's."""
    try:
        st = os.statvfs(where)
    except OSError:
        return False
    full = st.f_bavail * st.f_frsize < slack
    if fresh is None:
        return full
    nothing_left = (
        fresh.inodes is not None
        and st.f_files > 0
        and st.f_blocks > 0
        and st.f_files - st.f_ffree <= fresh.inodes
        and st.f_blocks == st.f_bfree
    )
    if not nothing_left:
        try:
            ours = os.stat(where).st_dev == fresh.dev
        except OSError:
            ours = False
        if ours:
            empty_shm(where)
    return full


def empty_shm(where: str = SHM) -> int:
    """Remove everything in (this worker's private) /dev/shm; how many entries there were."""
    try:
        names = os.listdir(where)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(where, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            continue
    return len(names)


def thread_faults(pid: int, prefix: str) -> dict[int, int]:
    """Minor page faults per named thread of ``pid``: ``{n: faults}`` for each thread whose
    name is ``prefix`` + a number (``/proc/<pid>/task/<tid>/comm`` and ``stat``, field 10).
    A thread that touches memory first takes its faults, so this says which thread made a
    process grow. Empty when ``/proc`` cannot be read."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
                name = f.read().strip().decode("ascii", "replace")
            if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
                continue
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            out[int(name[len(prefix) :])] = int(fields[7])  # minflt: field 10 of stat
        except (OSError, ValueError, IndexError):
            continue
    return out
