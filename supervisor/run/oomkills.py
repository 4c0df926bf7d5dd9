"""The OOM verdicts of ``run/memcg.py``: what a kernel OOM kill in a worker's cgroup means.

- A process of the job was killed (a subprocess, or any process on v1, which has no
  ``memory.oom.group``) while the worker lives: ``stop_after_oom`` stops the worker with
  reason ``memory_limit``, so the job ends as the kernel's kill, not as whatever the handler
  made of its child's death.
- The worker itself was SIGKILLed, not by fleetd, after an OOM kill in its cgroup:
  ``judge_reaped`` books that kill as ``memory_limit`` (a worker not ready yet: a boot failure,
  only logged, backed off by its pool).

Each returns how many new OOM kills it accounted for (the cgroup's counter minus what was seen).
"""

from __future__ import annotations

import logging
import signal

from supervisor.policy import KillKind, KillReason
from supervisor.run.cgroupfs import WorkerCgroup, oom_count, peak
from supervisor.run.exits import killed_by
from supervisor.run.workerproc import WorkerHandle, WorkerState
from supervisor.units import format_size

log = logging.getLogger("fleetd.memcg")


def stop_after_oom(
    worker: WorkerHandle,
    cg: WorkerCgroup,
    now: float,
    *,
    version: str,
    margin: int,
    job_id: int | None = None,
) -> int:
    """If the kernel OOM-killed a process in the worker's cgroup since the last look, kill
    the worker (reason memory_limit, about ``job_id`` if given). The new kills (0: none)."""
    new = _new_kills(cg, version)
    if not new:
        return 0
    detail = (
        f"the kernel OOM-killed {new} process(es) of the job at the worker's cgroup limit "
        f"of {_limits(cg, version, margin)}; worker stopped"
    )
    log.warning("worker %s (job %s): %s", worker.name, _job_of(worker), detail)
    worker.kill(KillReason(KillKind.MEMORY_LIMIT, detail, job_id), now)
    return new


def judge_reaped(
    worker: WorkerHandle, cg: WorkerCgroup, status: int, now: float, *, version: str, margin: int
) -> int:
    """A reaped worker SIGKILLed, not by us, after an OOM kill in its cgroup was killed by the
    kernel at the limit: give it that KillReason (so its job ends memory_limit, not crashed).
    The new kills (0: none)."""
    if not killed_by(status, signal.SIGKILL) or worker.kill_reason is not None:
        return 0
    new = _new_kills(cg, version)
    if not new:
        return 0
    detail = (
        f"killed by the kernel at its cgroup limit of {_limits(cg, version, margin)}: "
        "the job and its processes together"
    )
    if worker.state == WorkerState.STARTING:  # not a job's doing: a boot failure, backed off
        log.warning("worker %s %s, before it was ready", worker.name, detail)
    else:
        worker.record_kill(KillReason(KillKind.MEMORY_LIMIT, detail), now)
        log.warning("worker %s (job %s): %s", worker.name, _job_of(worker), detail)
    return new


def _new_kills(cg: WorkerCgroup, version: str) -> int:
    """OOM kills in the cgroup not accounted for yet; from now on they are."""
    count = oom_count(cg.path, version)
    if count is None or count <= cg.oom_seen:
        return 0
    new, cg.oom_seen = count - cg.oom_seen, count
    return new


def _limits(cg: WorkerCgroup, version: str, margin: int) -> str:
    """``1.1 GiB (memory_limit 1 GiB + 128 MiB margin; cgroup peak 1.1 GiB)``."""
    most = peak(cg.path, version)
    peak_text = f"; cgroup peak {format_size(most)}" if most is not None else ""
    return (
        f"{format_size(cg.limit)} (memory_limit {format_size(cg.memory_limit)} + "
        f"{format_size(margin)} margin{peak_text})"
    )


def _job_of(worker: WorkerHandle) -> int | str:
    return worker.job.claimed.job_id if worker.job else "-"
