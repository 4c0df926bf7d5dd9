"""Resource limits and memory figures inside a worker (Linux; elsewhere each call degrades).

Memory cap: RLIMIT_DATA by default, not RLIMIT_AS
--------------------------------------------------
Measured with ``stress/measure_rlimits.py`` on the build machine (Linux 6.18, x86_64, 2 vCPU,
Python 3.11.7, glibc malloc, overcommit_memory 0), a forked child, limit 256 MiB (details and
the full tables in docs/memory-limits.md)::

    case                                   RLIMIT_AS 256 MiB        RLIMIT_DATA 256 MiB
    bytearray(8 GiB)                       MemoryError in 1 ms,     MemoryError in 1 ms,
                                           child survives           child survives
    50 MiB touched chunks toward 4 GiB     MemoryError at 200 MiB   MemoryError at 200 MiB
    threads that each malloc (<= 64)       5 (bare) / 10 (*)        30 (bare) / 27 (*)
    private anonymous mmap, 1 GiB          ENOMEM                   ENOMEM
    shared anonymous mmap (mmap.mmap(-1))  ENOMEM                   NOT COUNTED: 384 MiB touched
    import numpy + matmul, threshold       172 MiB                  123 MiB
      just below the threshold             OpenBLAS "Memory allocation still failed", exit(1);
                                           with numpy imported before the fork: a hang

    (*) a parent that imported sqlalchemy, psutil, rich, click, prometheus_client, setproctitle

Why: RLIMIT_AS counts every reservation. A thread reserves an 8 MiB stack and, for each of the
first 8 x cores threads that call malloc, a 64 MiB glibc arena, while using a few KiB: a 256 MiB
cap allowed five threads (three arenas), and a numpy worker under ``as`` could not start ten
threads even at 503 MiB. RLIMIT_DATA counts writable private mappings: each thread's 8 MiB
stack, but of an arena only the part malloc has made writable. Both refuse the instant bomb at
once and leave the child alive, and since Linux 4.7 RLIMIT_DATA covers private anonymous mmaps,
which is where malloc puts every large block (measured above: not assumed).

What the rlimit cannot do, and why the parent's RSS watchdog is the precise enforcer:

- VmData counts reserved pages, RSS counts resident ones; neither bounds the other. A cap at
  exactly ``memory_limit`` would refuse ordinary jobs (threads, numpy's OpenBLAS buffers: its
  import takes VmData to 121 MiB with 26 MiB resident) long before their RSS got there.
- Shared memory (``mmap.mmap(-1, n)`` is MAP_SHARED), tmpfs files and file mappings escape
  RLIMIT_DATA; they show in RSS, so the watchdog sees them.
- A library that treats a refused allocation as fatal (OpenBLAS) exits or hangs instead of
  raising MemoryError; the parent then sees a crash or a timeout, not ``memory_limit``.

So the default cap is RLIMIT_DATA = ``memory_limit`` + ``headroom`` (128 MiB: above the 126 MiB
worst overshoot of a 50 ms RSS poll against a 2.4 GiB/s bomb, room for 16 thread stacks) + the
gap between VmData and RSS the worker inherited at fork (reservations the parent made and never
touched, so they do not eat the job's room). The rlimit stops ``bytearray(8 GiB)`` at once; the
watchdog stops the gradual bomb at ``memory_limit``; the rlimit bounds the watchdog's overshoot.
"""

from __future__ import annotations

import _signal
import ctypes
import ctypes.util
import os
import re
import resource
import signal
import time
from dataclasses import dataclass

MIB = 1024 * 1024
DEFAULT_HEADROOM = 128 * MIB
POLICIES = ("data", "as", "off")  # which rlimit caps memory; "off" leaves it to the watchdog
_RESOURCES = {"data": ("RLIMIT_DATA", "VmData + VmStk"), "as": ("RLIMIT_AS", "VmSize")}
PR_SET_PDEATHSIG = 1

# Kept-open /proc/self files, by name. Forgotten in a child at fork: an inherited fd still
# points at the *parent's* /proc entry (it would read its figures, or reset its peak), so a
# child opens its own (the inherited one is left open: it is the parent's). A hook, not a pid
# check: that was two getpid system calls a job. A process forked by C code without Python's
# hooks (no ``os.fork``) would keep them: the worker ends such a child when the handler that
# made it returns (workers/worker.py). Owned by the worker's main thread.
_proc_fds: dict[str, int] = {}
os.register_at_fork(after_in_child=_proc_fds.clear)
_HWM = re.compile(rb"VmHWM:\s+(\d+)")


@dataclass(frozen=True, slots=True)
class MemoryCap:
    """The memory rlimit a worker applied: which one, its value and the inherited gap."""

    rlimit: str  # "RLIMIT_DATA" or "RLIMIT_AS"
    value: int  # bytes, soft and hard
    inherited_gap: int  # bytes of VmData (or VmSize) over RSS at setup, added to the cap

    def describe(self) -> str:
        """``RLIMIT_DATA 412 MiB`` for messages."""
        return f"{self.rlimit} {self.value // MIB} MiB"


def _read_status() -> bytes:
    """/proc/self/status through a kept fd with pread (11 µs, against 55 µs for open, read
    and a line-by-line parse: it is read after every job); b"" without /proc."""
    fd = _proc_fd("status", os.O_RDONLY)
    if fd is None:
        return b""
    try:
        return os.pread(fd, 8192, 0)
    except OSError:
        return b""


def _status_bytes(pattern: re.Pattern[bytes]) -> int | None:
    """One kB figure of /proc/self/status, in bytes."""
    m = pattern.search(_read_status())
    return int(m[1]) * 1024 if m else None


def _proc_fd(name: str, flags: int) -> int | None:
    """An fd on /proc/self/<name> opened by this process (see ``_proc_fds``), or None."""
    fd = _proc_fds.get(name)
    if fd is None:
        try:
            fd = os.open(f"/proc/self/{name}", flags | os.O_CLOEXEC)
        except OSError:
            return None
        _proc_fds[name] = fd
    return fd


# After a reset the peak is read with getrusage, one system call, where /proc/self/status took
# ~8 µs to format and parse after every job. ru_maxrss is VmHWM, or, on kernels that keep the
# peak of an ended thread in the process's rusage (clear_refs does not lower that one), the
# larger of the two: a handler whose thread ended at a 1 GiB peak would make every later job's
# peak 1 GiB. (Linux 6.18 here keeps none: measured.) So the reset also notes the RSS; a
# ru_maxrss above it by more than STALE_SLACK is such a leftover, and a peak that did not rise
# above it is read from /proc/self/status after all. Within the slack a leftover can overstate
# a peak by that much.
STALE_SLACK = MIB
_since_reset: tuple[int, bool] | None = None  # (ru_maxrss right after the reset, is stale)


def peak_rss() -> int | None:
    """Peak RSS (VmHWM) in bytes since start or the last ``reset_peak_rss``; None if unknown."""
    if _since_reset is not None:
        base, stale = _since_reset
        peak = _maxrss()
        if peak > base or not stale:
            return peak
    return _status_bytes(_HWM)


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int | None:
    """Current RSS (VmRSS) in bytes, shared pages included; None without /proc. Read from
    /proc/self/statm (resident pages: the same counter, a fraction of status's cost)."""
    figures = _statm()
    return figures[1] if figures is not None else None


def _statm() -> tuple[int, int, int] | None:
    """VmSize, VmRSS and VmData + VmStk of this process in bytes (/proc/self/statm's first,
    second and sixth figures, through a kept fd); None without /proc."""
    fd = _proc_fd("statm", os.O_RDONLY)
    if fd is None:
        return None
    try:
        figures = os.pread(fd, 256, 0).split()
        page = resource.getpagesize()
        return int(figures[0]) * page, int(figures[1]) * page, int(figures[5]) * page
    except (OSError, IndexError, ValueError):
        return None


def prepare_peak_reset() -> bool:
    """Open /proc/self/clear_refs and /proc/self/status now and keep them.

    Call before dropping privileges: a change of uid makes the process non-dumpable, after which
    /proc/self files belong to root and clear_refs can no longer be opened for writing. An fd
    opened before still works (measured). Keeping the process non-dumpable matters: it holds a
    copy of the parent's memory, and other processes of the unprivileged user must not read it.
    """
    status = _proc_fd("status", os.O_RDONLY)
    statm = _proc_fd("statm", os.O_RDONLY)
    cleared = _proc_fd("clear_refs", os.O_WRONLY)
    return cleared is not None and status is not None and statm is not None


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (writes "5" to /proc/self/clear_refs, Linux >= 4.0).

    Returns False when it cannot (no /proc, or the file could not be opened or written); the
    next ``peak_rss`` is then the peak since the last successful reset or since start.
    """
    global _since_reset
    _since_reset = None
    fd = _proc_fd("clear_refs", os.O_WRONLY)
    if fd is None:
        return False
    try:
        os.write(fd, b"5")
    except OSError:
        return False
    base, rss = _maxrss(), current_rss()
    if rss is not None:
        _since_reset = (base, base > rss + STALE_SLACK)
    return True


def peak_since_start() -> None:
    """Count the next ``peak_rss`` from this process's start, as ``reset_peak_rss`` would from
    now: the same figure for a fresh worker's first job (its RSS has only grown since the
    fork, and a child's ru_maxrss is its own), without the reset's write and reads."""
    global _since_reset
    _since_reset = (0, False)


def apply_memory_cap(
    memory_limit: int, policy: str = "data", headroom: int = DEFAULT_HEADROOM
) -> MemoryCap | None:
    """Cap this process's memory with RLIMIT_DATA or RLIMIT_AS (soft and hard); see the module doc.

    The value is ``memory_limit + headroom`` plus the VmData (or VmSize) over RSS inherited at
    fork. Returns None for policy "off". It cannot raise a hard limit set by someone else: the
    value is then clamped to it. Raises ValueError when the cap would already be below this
    process's usage (every allocation would fail) and OSError when setrlimit refuses.
    """
    if policy == "off":
        return None
    if policy not in _RESOURCES:
        raise ValueError(f"memory rlimit policy {policy!r} is not one of {POLICIES}")
    name, field = _RESOURCES[policy]
    # statm, not status: a fresh worker runs this once, and status's parse cost it ~0.1 ms of
    # copy-on-write faults (measured). Its data figure counts the stack too (VmStk, ~0.1 MiB
    # at this point), so the gap, and the cap, are that much larger than VmData's would be.
    size, rss, data = _statm() or (0, 0, 0)
    used = size if policy == "as" else data
    gap = max(0, used - rss)
    value = memory_limit + headroom + gap
    res = getattr(resource, name)
    hard = resource.getrlimit(res)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    if value <= used:
        raise ValueError(
            f"{name} {value // MIB} MiB would be below the worker's {field} of {used // MIB} MiB "
            f"at start (memory_limit {memory_limit // MIB} MiB, RSS {rss // MIB} MiB)"
        )
    resource.setrlimit(res, (value, value))
    return MemoryCap(name, value, gap)


def disable_core_dumps() -> bool:
    """RLIMIT_CORE 0, soft and hard: a crashing job must not write the parent's memory to disk."""
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError):
        return False
    return True


def limit_processes(nproc: int) -> None:
    """RLIMIT_NPROC, soft and hard, to contain a fork bomb.

    What it cannot do: it counts every process and thread of the real uid on the host, not of
    this worker, so it only means something with a dedicated ``user``; and it does not bind a
    process with CAP_SYS_RESOURCE or CAP_SYS_ADMIN, so a worker running as root is not limited.
    Raises OSError when setrlimit refuses (a value above a hard limit set by someone else).
    """
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def libc() -> ctypes.CDLL | None:
    """The C library, loaded once, with errno kept (None where it cannot be loaded). Loaded
    at import, in the supervisor, so a forked worker finds it ready: ``ctypes.CDLL(None)``
    and the first lookup of each function cost ~0.2 ms a call in a fresh worker (measured)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            for name in ("prctl", "malloc_trim", "timer_create", "timer_settime", "unshare"):
                getattr(_libc, name, None)  # resolve now: looked up once, then cached
        except OSError:
            return None
    return _libc


_libc: ctypes.CDLL | None = None


def set_pdeathsig(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (prctl, Linux).

    What it cannot do: the signal fires when the parent *thread* that forked exits, so the
    parent must fork from its main thread; a change of uid or gid clears the setting, so call
    this after dropping privileges; it cannot cover the time before it is called, so check
    ``os.getppid()`` right after. Returns False where prctl is unavailable.
    """
    c = libc()
    if c is None or not hasattr(c, "prctl"):
        return False
    return c.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0


# Each slot's thread (workers/slots.py) gets a stack of this size (glibc's usual default,
# set there so it is known). A stack is private writable memory: RLIMIT_DATA and RLIMIT_AS
# count all of it as allocated though only the pages used are resident, so a worker with
# slots gets one stack per slot (and the event loop's thread, and a guard each) on top of
# memory_limit + headroom; without it 100 slots under a 512 MiB memory_limit could not start
# their threads.
SLOT_STACK = 8 * 1024 * 1024
STACK_GUARD = 64 * 1024


def slot_stacks(slots: int) -> int:
    """Bytes of thread stacks a worker with ``slots`` adds to its memory rlimit."""
    return (slots + 1) * (SLOT_STACK + STACK_GUARD)


PR_SET_NAME = 15
THREAD_NAME_PREFIX = "job-"  # + the job id (15 bytes in all): how the parent finds a slot's thread


def name_thread(job_id: int) -> bool:
    """Name the calling thread after its job (``job-<id>``, prctl PR_SET_NAME; the kernel
    keeps 15 bytes), so the parent can tell which slot's thread took a worker's page faults
    (``/proc/<pid>/task/<tid>/comm`` and ``stat``). False where prctl is unavailable."""
    c = libc()
    if c is None or not hasattr(c, "prctl"):
        return False
    name = f"{THREAD_NAME_PREFIX}{job_id}".encode()[:15]
    return c.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0) == 0


def trim_heap() -> bool:
    """Give free malloc memory back to the kernel (glibc ``malloc_trim(0)``); False elsewhere.

    Used before deciding a worker leaks: freed memory that glibc kept would otherwise count.
    """
    c = libc()
    if c is None or not hasattr(c, "malloc_trim"):
        return False
    c.malloc_trim(0)
    return True


# ---- the deadline alarm: a per-process POSIX timer ----------------------------------------

DEADLINE_SIGNAL = signal.SIGRTMIN + 3  # default action: terminate; nothing else uses it
_CLOCK_MONOTONIC = 1
_SIGEV_SIGNAL = 0


class _Sigevent(ctypes.Structure):
    _fields_ = [  # struct sigevent on Linux: 64 bytes
        ("sigev_value", ctypes.c_void_p),
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("_pad", ctypes.c_int * 12),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class DeadlineAlarm:
    """A POSIX timer on the monotonic clock that sends this process ``DEADLINE_SIGNAL`` (a
    real-time signal whose default action ends the process) when armed time runs out.

    A timer of its own, so it neither replaces nor is replaced by a handler's ``signal.alarm``
    or ``setitimer`` (one ITIMER_REAL per process). What it cannot do: a handler that installs
    its own handler for this very signal defeats it; it ends the worker, not processes the job
    started (the parent kills the worker's process group when it reaps it)."""

    # the library and the event, found and built once (``prepare``: in the forker, so a
    # fresh worker does not look up a function or build a structure)
    _lib: ctypes.CDLL | None = None
    _event: _Sigevent | None = None

    @classmethod
    def prepare(cls) -> None:
        if cls._lib is None:
            lib = libc()
            if lib is None or not hasattr(lib, "timer_create"):  # glibc < 2.34: in librt
                lib = ctypes.CDLL(ctypes.util.find_library("rt"), use_errno=True)
            lib.timer_settime  # noqa: B018  (a CDLL keeps a function once looked up)
            cls._event = _Sigevent(sigev_signo=int(DEADLINE_SIGNAL), sigev_notify=_SIGEV_SIGNAL)
            cls._lib = lib

    def __init__(self) -> None:
        # not ignored, whatever we inherited (the C function: no Signals enum)
        _signal.signal(int(DEADLINE_SIGNAL), _signal.SIG_DFL)
        self.prepare()
        self._libc = self._lib
        self._timer = ctypes.c_void_p()
        created = self._libc.timer_create(
            _CLOCK_MONOTONIC, ctypes.byref(self._event), ctypes.byref(self._timer)
        )
        if created != 0:
            raise OSError(ctypes.get_errno(), "timer_create failed")
        self._settime = self._libc.timer_settime
        self._spec = _Itimerspec()
        # when it fires (monotonic, read just before arming: it fires no earlier), or None
        self.fires_at: float | None = None

    def arm(self, seconds: float) -> None:
        """Fire ``seconds`` from now (0 disarms)."""
        self.fires_at = time.monotonic() + seconds if seconds > 0 else None
        whole = int(seconds)
        self._spec.it_value.tv_sec = whole
        self._spec.it_value.tv_nsec = int((seconds - whole) * 1e9)
        if self._settime(self._timer, 0, ctypes.byref(self._spec), None) != 0:
            self.fires_at = None  # unknown: the next ``arm_between`` arms it again
            raise OSError(ctypes.get_errno(), "timer_settime failed")

    def arm_between(self, seconds: float, slack: float) -> None:
        """Fire between ``seconds`` and ``seconds + slack`` from now. The time already armed
        is kept when it falls in that window, so a worker running short jobs makes the
        system call (through ctypes, ~2 µs) once every ``slack`` seconds, not once a job."""
        now = time.monotonic()
        fires_at = self.fires_at
        if fires_at is None or not now + seconds <= fires_at <= now + seconds + slack:
            self.arm(seconds + slack)


libc()  # at import, in the supervisor: see ``libc``
