"""``MemoryCgroups``: one memory cgroup per worker, the kernel-enforced backstop of memory_limit.

Layout, under the supervisor's own memory cgroup (``supervisor.host.memory_cgroup``)::

    <our cgroup>/fleetd-<supervisor pid>/<pool>-<slot>-<worker pid>/

Each worker's cgroup is limited to ``memory_limit + MARGIN``; swap is bounded too (v1
``memory.memsw.limit_in_bytes`` = the same value, v2 ``memory.swap.max`` = 0), so a limit is
not a licence to swap. The parent moves the worker in right after the fork, before any job is
sent; everything the worker's job starts (subprocesses, their children, also after ``setsid``)
is born inside it and counted together.

Why a margin: the RSS watchdog (``supervisor.run.watchdog``) stops a worker at ``memory_limit``
with the job's peak in the message; the cgroup must not beat it to it. MARGIN is
``workers.limits.DEFAULT_HEADROOM`` (128 MiB), the same room the RLIMIT_DATA cap leaves: four
times the watchdog's worst overshoot measured at its 20 ms poll (32 MiB, docs/memory-limits.md),
over twice what a 2.4 GiB/s bomb grows in 20 ms, plus what the cgroup counts and RSS does not
(page tables, kernel memory). Page cache is charged too but is reclaimed before an
OOM kill. What the cgroup catches is what the others cannot: memory of the job's *subprocesses*
(the watchdog reads only the worker's RSS; RLIMIT_DATA is per process), shared memory, and a
supervisor too slow to poll.

What the kernel does at the limit: it reclaims, then OOM-kills the largest process *in this
cgroup only*. v2 gets ``memory.oom.group = 1`` (the whole worker dies at once); v1 has no such
switch, so the victim may be one subprocess while the worker survives. Either way the job ends
``memory_limit``:

- the worker itself was killed: ``worker_exited`` finds the OOM kill in the cgroup's counter
  (v1 ``memory.oom_control`` / v2 ``memory.events``: ``oom_kill N``) and gives it a KillReason;
- a subprocess was killed: ``inspect`` (every watchdog period) or ``failed_by_oom`` (before a
  JobFailed is believed: the handler usually fails *because* its child was killed) sees the
  counter rise and kills the worker's process group with reason ``memory_limit``.

After a worker is reaped its cgroup is handed to the next worker forked (``REUSE_AT_MOST`` kept)
when it is empty and little is still charged to it, else removed as soon as it is empty (the
job's processes die with the worker's process group, which takes a moment); processes still in
it a second later escaped that kill (setsid) and get SIGKILL, with a warning. Why reuse: a pool
with a fresh worker per job made and removed a cgroup per job, each mkdir and rmdir taking the
kernel's cgroup lock while the workers' own moves into their cgroups held it too (the loop's
CPU a job 1.26 → 1.11 ms, ``python -m stress bench-fresh``), and every removed memory cgroup
lingers in the kernel while page cache is still charged to it.
At start, the ``fleetd-<pid>`` cgroups of supervisors that are gone are removed when empty.
Every operation degrades: a failure is logged once and that worker (or the fleet) runs without
a cgroup, with the rlimit and the watchdog still in force. Owned by the main thread; no threads.

This module keeps the per-worker bookkeeping (which cgroup is whose, reuse, removal);
``run/cgroupfs.py`` does the file operations on the tree and ``run/oomkills.py`` judges the
OOM kills.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from supervisor import host
from supervisor.run import cgroupfs, oomkills
from supervisor.run.cgroupfs import WorkerCgroup
from supervisor.run.watchdog import PERIOD
from supervisor.run.workerproc import WorkerHandle
from supervisor.units import format_size
from workers import limits

log = logging.getLogger("fleetd.memcg")

MARGIN = limits.DEFAULT_HEADROOM
SWEEP_EVERY = 1.0  # seconds between retries of cgroup removals that failed
REUSE_AT_MOST = 8  # emptied worker cgroups kept for the next forks
# ... and only those with less than this still charged to them (page cache the job read). A
# job's files in the host's /dev/shm stay charged to the cgroup they were written in: a cgroup
# holding them is removed, never handed to the next worker, whose limit they would eat.
REUSE_BELOW = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Prepared:
    """A worker cgroup made before its fork: its path, the fd on its cgroup.procs the child
    writes to, and its limits."""

    path: Path
    fd: int
    limit: int
    memory_limit: int
    oom_seen: int = 0  # a reused cgroup's oom_kill count so far: its earlier workers'


def cgroup_limit(memory_limit: int, margin: int = MARGIN) -> int:
    """The cgroup limit for a pool's worker: ``memory_limit`` plus the margin."""
    return memory_limit + margin


class MemoryCgroups:
    def __init__(
        self,
        enabled: bool = True,
        *,
        pid: int | None = None,
        margin: int = MARGIN,
        detect: Callable[[], host.MemoryCgroup] = host.memory_cgroup,
    ) -> None:
        self.enabled = enabled
        self.pid = pid or os.getpid()
        self.margin = margin
        self.detect = detect
        self.mechanism = host.MemoryCgroup("none", None, "not started")
        self.base: Path | None = None  # <our cgroup>/fleetd-<pid>, once created
        self.cgroups: dict[int, WorkerCgroup] = {}  # by worker pid
        self.pending: dict[Path, float | None] = {}  # cgroups to remove: when to kill strays
        self.reusable: list[WorkerCgroup] = []  # emptied, kept for the next forks
        self.oom_kills = 0  # kernel OOM kills seen in workers' cgroups
        self.prepared = 0  # cgroups prepared before a fork (their temporary names)
        self._warned: set[str] = set()

    @property
    def version(self) -> str:
        """The mechanism in use: v1, v2, or none when the fleet runs without cgroups."""
        return self.mechanism.mechanism if self.base is not None else "none"

    # ---- start and stop ----------------------------------------------------------------

    def start(self) -> host.MemoryCgroup:
        """Detect the mechanism, remove stale cgroups, create ours. Never raises."""
        if not self.enabled:
            self.mechanism = host.MemoryCgroup("none", None, "memory_cgroup = false in fleet.toml")
        else:
            self.mechanism = self.detect()
        if self.mechanism.path is None:
            log.info("memory cgroups off: %s", self.mechanism.reason)
            return self.mechanism
        parent = self.mechanism.path
        self.remove_stale(parent)
        base = parent / f"fleetd-{self.pid}"
        try:
            base.mkdir(exist_ok=True)
            if self.mechanism.mechanism == "v2":
                (base / "cgroup.subtree_control").write_text("+memory")
        except OSError as exc:
            with contextlib.suppress(OSError):
                base.rmdir()
            self.mechanism = host.MemoryCgroup(
                "none", None, f"cannot set up {base}: {exc.strerror or exc}"
            )
            log.warning("memory cgroups off: %s", self.mechanism.reason)
            return self.mechanism
        self.base = base
        log.info(
            "memory cgroups: %s, one per worker under %s at memory_limit + %s",
            self.mechanism.mechanism,
            base,
            format_size(self.margin),
        )
        return self.mechanism

    def remove_stale(self, parent: Path) -> list[Path]:
        """Remove the cgroups of supervisors that are gone (``cgroupfs.remove_stale``); what
        is not empty yet is removed by a later sweep. What was removed at once."""
        removed, left = cgroupfs.remove_stale(parent, self.pid)
        for path in left:
            self.pending[path] = 0.0  # removed once empty (the next sweeps)
        return removed

    def close(self) -> None:
        """At shutdown: empty and remove every worker cgroup left, then ours."""
        kept = (*self.cgroups.values(), *self.reusable)
        paths = [*self.pending, *(cg.path for cg in kept)]
        self.cgroups.clear()
        self.reusable.clear()
        self.pending = dict.fromkeys(paths, 0.0)  # at shutdown, strays are killed at once
        self._sweep(float("inf"))
        if self.base is not None and not cgroupfs.remove(self.base):
            log.info(
                "left %s behind (processes still exiting); the next fleetd removes it", self.base
            )
        self.base = None

    # ---- one worker --------------------------------------------------------------------

    def attach(self, worker: WorkerHandle, memory_limit: int | None) -> None:
        """Put a freshly forked worker in a cgroup of its own (parent side, before any job)."""
        if self.base is None or memory_limit is None:
            return
        limit = cgroup_limit(memory_limit, self.margin)
        path = self.base / f"{worker.pool}-{worker.slot}-{worker.pid}"
        try:
            self._make_limited(path, limit)
            cgroupfs.write(path / "cgroup.procs", worker.pid)
        except OSError as exc:
            gone = exc.errno == errno.ESRCH  # the worker died already: nothing to warn about
            if not gone:
                self._warn(
                    "attach",
                    f"worker {worker.name} runs without a memory cgroup: "
                    f"cannot set up {path}: {exc.strerror or exc} (logged once)",
                )
            self._release(path)
            return
        self.cgroups[worker.pid] = WorkerCgroup(path, limit, memory_limit)

    def _make_limited(self, path: Path, limit: int) -> None:
        cgroupfs.make_limited(path, limit, self.mechanism.mechanism)

    def prepare(self, pool: str, slot: int, memory_limit: int | None) -> Prepared | None:
        """Before a fork: a worker cgroup with its limit, and an open fd on its
        ``cgroup.procs`` that the child inherits and writes ``0`` to (joining it itself, in
        its own setup). Moving a process into a v1 cgroup waits ~2-3 ms in the kernel; done
        here, that wait was on the loop's thread for every fork (measured with ``python -m
        stress bench-fresh``). None when there is no cgroup to prepare."""
        if self.base is None or memory_limit is None:
            return None
        limit = cgroup_limit(memory_limit, self.margin)
        reused = self._take_reusable(limit)
        if reused is not None:
            try:
                fd = os.open(reused.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                self._release(reused.path)  # gone or broken: make a new one below
            else:
                return Prepared(reused.path, fd, limit, memory_limit, reused.oom_seen)
        self.prepared += 1
        path = self.base / f"{pool}-{slot}-new{self.prepared}"
        try:
            self._make_limited(path, limit)
            fd = os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            self._warn(
                "attach",
                f"workers of pool {pool} run without a memory cgroup: cannot set up {path}: "
                f"{exc.strerror or exc} (logged once)",
            )
            self._release(path)
            return None
        return Prepared(path, fd, limit, memory_limit)

    def adopt(self, worker: WorkerHandle, prepared: Prepared | None) -> None:
        """After the fork: close the parent's copy of the fd, name the cgroup after the
        worker's pid (``<pool>-<slot>-<pid>``: a rename keeps the child's fd valid) and
        watch it like an attached one."""
        if prepared is None:
            return
        os.close(prepared.fd)
        path = prepared.path.with_name(f"{worker.pool}-{worker.slot}-{worker.pid}")
        try:
            prepared.path.rename(path)
        except OSError:
            path = prepared.path
        self.cgroups[worker.pid] = WorkerCgroup(
            path, prepared.limit, prepared.memory_limit, prepared.oom_seen
        )

    def abandon(self, prepared: Prepared) -> None:
        """The fork failed: close the fd and remove the cgroup."""
        os.close(prepared.fd)
        self._release(prepared.path)

    def path_of(self, pid: int) -> Path | None:
        cg = self.cgroups.get(pid)
        return cg.path if cg is not None else None

    def inspect(self, workers: Iterable[WorkerHandle], now: float) -> None:
        """For busy workers, at most once per watchdog period each: a kernel OOM kill inside
        the worker's cgroup (a subprocess was the victim) stops the worker: memory_limit.
        Also retries cgroup removals that failed."""
        for worker in workers:
            cg = self.cgroups.get(worker.pid)
            if cg is None or worker.job is None or worker.kill_reason is not None:
                continue
            if now < cg.next_check:
                continue
            cg.next_check = now + PERIOD
            self._kill_on_oom(worker, cg, now)
        if self.pending:
            self._sweep(now)

    def failed_by_oom(self, worker: WorkerHandle, now: float, job_id: int | None = None) -> bool:
        """Before a busy worker's JobFailed is believed: if the kernel OOM-killed a process in
        its cgroup, the failure is that kill's consequence. The worker is then stopped with
        reason memory_limit and True returned: the caller records that job's failure as
        memory_limit and goes on with the frames after it. Not asked for JobDone (a result is
        a result, and this keeps the hot path free of cgroup reads)."""
        cg = self.cgroups.get(worker.pid)
        if cg is None or worker.job is None or worker.kill_reason is not None:
            return False
        return self._kill_on_oom(worker, cg, now, job_id)

    def worker_exited(self, worker: WorkerHandle, status: int, now: float) -> None:
        """A worker was reaped. If it was SIGKILLed, not by us, after an OOM kill in its
        cgroup, the kernel killed it at the limit: give it that KillReason (so the job ends
        memory_limit, not crashed). Then empty and remove its cgroup."""
        cg = self.cgroups.pop(worker.pid, None)
        if cg is None:
            return
        version = self.mechanism.mechanism
        self.oom_kills += oomkills.judge_reaped(
            worker, cg, status, now, version=version, margin=self.margin
        )
        self._retire(cg)

    # ---- internals ---------------------------------------------------------------------

    def _kill_on_oom(
        self, worker: WorkerHandle, cg: WorkerCgroup, now: float, job_id: int | None = None
    ) -> bool:
        version = self.mechanism.mechanism
        new = oomkills.stop_after_oom(
            worker, cg, now, version=version, margin=self.margin, job_id=job_id
        )
        self.oom_kills += new
        return new > 0

    def _retire(self, cg: WorkerCgroup) -> None:
        """A reaped worker's cgroup: kept for the next fork when it is empty and less than
        ``REUSE_BELOW`` is charged to it (its peak counter reset, its OOM count remembered as
        the baseline; the oldest kept is removed past ``REUSE_AT_MOST``), else released."""
        version = self.mechanism.mechanism
        charged = cgroupfs.charged(cg.path, version)  # unreadable counts as too much to reuse
        if not cgroupfs.procs(cg.path) and charged is not None and charged < REUSE_BELOW:
            if len(self.reusable) >= REUSE_AT_MOST:  # the oldest goes: its limit may be
                self._release(self.reusable.pop(0).path)  # one no pool forks with any more
            oom = cgroupfs.oom_count(cg.path, version)
            cg.oom_seen = oom if oom is not None else cg.oom_seen
            cg.next_check = 0.0
            cgroupfs.reset_peak(cg.path, version)
            self.reusable.append(cg)
            return
        self._release(cg.path)

    def _take_reusable(self, limit: int) -> WorkerCgroup | None:
        """A kept cgroup with this limit, taken off the list; None if there is none."""
        for i, cg in enumerate(self.reusable):
            if cg.limit == limit:
                return self.reusable.pop(i)
        return None

    def _release(self, path: Path) -> None:
        """Remove a reaped worker's cgroup, or leave it to the sweep while processes are in
        it: right after the reap those are usually the job's processes still exiting from
        the kill of the worker's process group."""
        if cgroupfs.procs(path) or not cgroupfs.remove(path):
            self.pending.setdefault(path, None)

    def _sweep(self, now: float) -> None:
        """Retry pending removals. A cgroup still holding processes SWEEP_EVERY after it was
        first swept holds strays of a job that escaped the kill of its process group (setsid,
        for instance): they get SIGKILL, and a warning once."""
        for path, due in list(self.pending.items()):
            strays = cgroupfs.procs(path)
            if strays and due is None:
                self.pending[path] = now + SWEEP_EVERY
                continue
            if strays and now >= due:
                for pid in strays:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                self._warn(
                    f"strays {path}",
                    f"killed {len(strays)} process(es) a job left behind in {path.name}: "
                    + " ".join(map(str, strays)),
                )
            if not strays and cgroupfs.remove(path):
                del self.pending[path]

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)
