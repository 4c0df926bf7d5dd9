"""The watchdog decides *that* a busy worker must die, and why; it never kills by itself.

Two limits, checked every watchdog tick (tens of milliseconds) for busy workers only:
- wall clock: the job's deadline (``timeout``) has passed;
- memory: the worker's RSS is above ``memory_limit``. One ``memory_info()`` read per busy
  worker (~7 µs). The child's RLIMIT_DATA stops instant bombs itself; this stops the gradual
  ones, with an overshoot bounded by the poll period times the allocation rate.

Memory is the job's whole tree: the worker's RSS plus the proportional set size of each of its
descendants (the worker is a subreaper, so a daemon the job left is still one of them;
``workers.tree``). A worker without descendants costs one ``children`` read more per poll.

A command handler (``workers.command``) stops its own program at the job's deadline (SIGTERM,
a short grace, SIGKILL) and reports ``timeout`` itself, so for its kinds the deadline here is
``COMMAND_GRACE`` later: the worker's kill ladder runs first, this kill is the backstop.

What it cannot see: a job that finishes between two polls above the limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from supervisor.config.pool import PoolConfig
from supervisor.policy import KillKind, KillReason
from supervisor.run.workerproc import InFlight, WorkerHandle
from supervisor.units import format_duration, format_size
from workers import tree
from workers.command import TERM_GRACE, CommandSpec
from workers.limits import THREAD_NAME_PREFIX

PERIOD = 0.02  # seconds between watchdog passes while a job runs
COMMAND_GRACE = TERM_GRACE + 0.5  # past the deadline, for a command's own stop to report
ASYNC_GRACE = 1.0  # past the deadline, for an async handler's cancelled task to report


def grace(config: PoolConfig, kind: str) -> float:
    """Seconds past the deadline before the watchdog acts on a job of ``kind``."""
    return COMMAND_GRACE if isinstance(config.handlers.get(kind), CommandSpec) else 0.0


def inspect(
    workers: Iterable[WorkerHandle],
    pools: Mapping[str, PoolConfig],
    now: float,
    async_kinds: frozenset[tuple[str, str]] = frozenset(),
) -> list[tuple[WorkerHandle, KillReason]]:
    """Orders for busy workers past their deadline or memory limit. A ``soft_timeout`` order
    means "signal the handler" (``SoftTimeout``); every other order means SIGKILL. In a
    worker with slots every running job has its deadline; the order names the job it is
    about (``KillReason.job_id``). ``async_kinds``: (pool, kind) of ``async def`` handlers,
    whose task the worker cancels at the deadline itself (``ASYNC_GRACE`` before the kill)."""
    orders: list[tuple[WorkerHandle, KillReason]] = []
    for worker in workers:
        job = worker.job
        if not worker.watched or job is None or worker.kill_reason is not None:
            continue
        config = pools[worker.pool]
        overdue = _overdue(worker, config, now, async_kinds)
        if overdue is not None:
            order = _deadline_order(worker, config, now)
            if worker.slots > 1 or (worker.pool, overdue.claimed.kind) in async_kinds:
                # a thread cannot take SoftTimeout (a signal reaches the main thread only)
                took = f"ran past its timeout of {format_duration(config.timeout)}"
                order = KillReason(KillKind.TIMEOUT, took)
            if worker.slots > 1:
                order = replace(order, job_id=overdue.claimed.job_id)
            orders.append((worker, order))
            continue
        limit = config.memory_limit
        if limit is None:
            continue
        rss, procs = tree.tree_memory(worker.pid, worker.rss())
        if rss is not None:
            worker.last_rss = max(worker.last_rss or 0, rss)
        if rss is not None and rss > limit:
            what = (
                f"memory of the worker and {procs} process(es) of its job"
                if procs
                else "worker RSS"
            )
            detail = (
                f"{what} {format_size(rss)} passed memory_limit {format_size(limit)} "
                f"(peak seen {format_size(worker.last_rss or rss)}); stopped by the watchdog"
            )
            blamed = _memory_target(worker)
            if blamed is not None and len(worker.running) > 1:
                detail += (
                    f"; its {len(worker.running)} slots share the worker's memory: blamed on "
                    "the job whose thread took the most page faults"
                )
            orders.append((worker, KillReason(KillKind.MEMORY_LIMIT, detail, blamed)))
    return orders


def _overdue(
    worker: WorkerHandle,
    config: PoolConfig,
    now: float,
    async_kinds: frozenset[tuple[str, str]],
) -> InFlight | None:
    """The running job past its deadline (and grace), the one due first; None if none."""
    due = None
    for job in worker.running.values():
        kind = job.claimed.kind
        extra = ASYNC_GRACE if (worker.pool, kind) in async_kinds else grace(config, kind)
        if now >= job.deadline + extra and (due is None or job.deadline < due.deadline):
            due = job
    return due


def _memory_target(worker: WorkerHandle) -> int | None:
    """The job a memory kill of a worker with slots is about: RSS is the worker's, but a
    thread that touches new memory takes the page faults, so the running job whose thread
    (named ``job-<id>``, workers/limits.py) took the most minor faults is blamed. None
    with one job (the kill is about it) or when no thread can be read (an async handler's
    jobs share the event loop's thread): then the oldest job."""
    if len(worker.running) <= 1:
        return None
    faults = tree.thread_faults(worker.pid, THREAD_NAME_PREFIX)
    known = {job_id: n for job_id, n in faults.items() if job_id in worker.running}
    if not known:
        return None
    return max(known, key=known.__getitem__)


def _deadline_order(worker: WorkerHandle, config: PoolConfig, now: float) -> KillReason:
    """Past the deadline: first the soft signal when the pool has a soft_timeout window,
    then SIGKILL once the window is over (or at once without one)."""
    took = f"ran past its timeout of {format_duration(config.timeout)}"
    if config.soft_timeout > 0 and worker.soft_signalled_at is None:
        return KillReason(KillKind.SOFT_TIMEOUT, f"{took}; SoftTimeout raised in the handler")
    if (
        worker.soft_signalled_at is not None
        and now < worker.soft_signalled_at + config.soft_timeout
    ):
        return KillReason(KillKind.WAIT, "")
    return KillReason(KillKind.TIMEOUT, took)
