"""A worker's setup: everything between the fork and ``Ready``, in an order that matters::

    join the memory cgroup the parent prepared (cgroup_fd), if any
    a private /dev/shm (root only)
    signals: INT/TERM ignored, parent's handlers and wake-up fd dropped, mask cleared
    PR_SET_PDEATHSIG=SIGKILL, the job folders' directory, privilege drop, PDEATHSIG again,
    getppid() check
    RLIMIT_CORE 0, memory rlimit, RLIMIT_NPROC, child subreaper, the deadline alarm

A step that fails ends the worker with SETUP_FAILED (``WorkerExit``); a parent gone before
PDEATHSIG was set, with PARENT_GONE. A refusal the worker can live with (no cgroup, the host's
/dev/shm, no POSIX timers) is said on stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from workers import command, exitcodes, limits, privileges, scratch, tree
from workers.exiting import WorkerExit, say
from workers.signals import reset_signals
from workers.spec import WorkerSpec


@dataclass(frozen=True)
class Started:
    """What setup left for the job loop."""

    cap: limits.MemoryCap | None  # the memory rlimit applied, if any
    alarm: limits.DeadlineAlarm | None  # the backstop timer (spec.hard_deadline), if any
    subreaper: bool  # PR_SET_CHILD_SUBREAPER took
    own_shm: bool  # /dev/shm is this worker's own (emptied after every job)
    shm_fresh: tree.ShmBaseline | None  # what it counts empty, which it is


def start(conn_fd: int, spec: WorkerSpec, rlimit_headroom: Callable[[], int]) -> Started:
    """Set this forked process up as ``spec``'s worker on ``conn_fd``. ``rlimit_headroom``:
    the bytes the memory rlimit allows above ``memory_limit`` (asked only when there is one:
    a worker with slots adds its threads' stacks)."""
    _join_cgroup(spec)  # first: what the worker touches from here on is charged to it
    own_shm, shm_fresh = _private_shm(spec)  # before the privilege drop
    reset_signals()
    os.set_blocking(conn_fd, True)
    limits.set_pdeathsig(signal.SIGKILL)  # at once: covers the privilege drop below
    if spec.max_jobs_per_worker != 1:  # the first job needs no reset
        limits.prepare_peak_reset()  # before the uid change makes /proc/self root's
    _make_scratch(spec)  # before the uid change: owned by the user it becomes
    _drop_privileges(spec)
    limits.set_pdeathsig(signal.SIGKILL)  # again: a uid or gid change cleared it
    if os.getppid() != spec.parent_pid:
        raise WorkerExit(exitcodes.PARENT_GONE, "the parent exited before PDEATHSIG was set")
    cap = _apply_limits(spec, rlimit_headroom)
    # the job's processes that lose their parent (a daemon: double fork, setsid) come
    # to this worker, not init: counted, and killed when the job ends (workers.tree)
    subreaper = tree.become_subreaper()
    return Started(cap, _deadline_alarm(spec), subreaper, own_shm, shm_fresh)


def _join_cgroup(spec: WorkerSpec) -> None:
    """Write "0" (this process) to the cgroup.procs fd the parent prepared, and close it.
    A refusal is said on stderr: the worker then runs without its cgroup (the rlimit
    and the watchdog stay)."""
    fd = spec.cgroup_fd
    if fd is None:
        return
    try:
        os.write(fd, b"0")
    except OSError as exc:
        say(spec, f"could not join its memory cgroup: {exc}")
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _private_shm(spec: WorkerSpec) -> tuple[bool, tree.ShmBaseline | None]:
    """A /dev/shm of the worker's own, sized at its memory cap, when asked for and root;
    whether it took, and its empty state."""
    if not spec.private_shm or os.geteuid() != 0:
        return False, None
    limit = spec.memory_limit
    why = tree.private_shm(limit + spec.rlimit_headroom if limit else None)
    if why is not None:
        if scratch.first_time(spec.scratch_root, "shm"):
            say(spec, f"shares the host's /dev/shm: {why} (said once)")
        return False, None
    return True, tree.shm_baseline()


def _make_scratch(spec: WorkerSpec) -> None:
    """This worker's directory for its command jobs' folders (``workers.scratch``); none
    when it has no command handler."""
    if spec.scratch_root is None or not command.runs_commands(spec.handlers):
        return
    try:
        identity = privileges.resolve(spec.user, spec.group)
    except KeyError:
        identity = None  # _drop_privileges says why and exits
    owner = None
    if identity is not None:
        owner = (-1 if identity.uid is None else identity.uid, identity.gid)
    command.FOLDER_ROOT = scratch.make_worker_dir(spec.scratch_root, spec.pool, spec.slot, owner)


def _drop_privileges(spec: WorkerSpec) -> None:
    """Switch to the pool's user/group, if any."""
    try:
        identity = privileges.resolve(spec.user, spec.group)
        if identity is not None:
            privileges.drop(identity)
    except (KeyError, OSError) as exc:
        why = f"setup failed: cannot switch to user={spec.user!r} group={spec.group!r}: {exc}"
        raise WorkerExit(exitcodes.SETUP_FAILED, why) from exc


def _apply_limits(spec: WorkerSpec, rlimit_headroom: Callable[[], int]) -> limits.MemoryCap | None:
    """RLIMIT_CORE 0, the memory cap and RLIMIT_NPROC; the memory cap applied."""
    limits.disable_core_dumps()
    cap = None
    try:
        if spec.memory_limit is not None:
            cap = limits.apply_memory_cap(spec.memory_limit, spec.rlimit_policy, rlimit_headroom())
        if spec.nproc_limit is not None:
            limits.limit_processes(spec.nproc_limit)
    except (OSError, ValueError) as exc:
        raise WorkerExit(exitcodes.SETUP_FAILED, f"setup failed: {exc}") from exc
    return cap


def _deadline_alarm(spec: WorkerSpec) -> limits.DeadlineAlarm | None:
    """The backstop timer for ``spec.hard_deadline``; none without one, or without POSIX
    timers (then the parent's kill alone, as said on stderr)."""
    if spec.hard_deadline is None:
        return None
    try:
        return limits.DeadlineAlarm()
    except (OSError, AttributeError) as exc:
        say(spec, f"no deadline alarm ({exc}); the supervisor's kill only")
        return None
