"""The watchdog decides *that* a busy worker must die, and why; it never kills by itself.

Two limits, checked every watchdog tick (tens of milliseconds) for busy workers only:
- wall clock: the job's deadline (``timeout``) has passed;
- memory: the worker's RSS is above ``memory_limit``. One ``memory_info()`` read per busy
  worker (~7 µs). The child's RLIMIT_DATA stops instant bombs itself; this stops the gradual
  ones, with an overshoot bounded by the poll period times the allocation rate.

What it cannot see: memory of the job's own subprocesses (only the worker's RSS is read), and
a job that finishes between two polls above the limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from supervisor.config import PoolConfig
from supervisor.policy import KillKind, KillReason
from supervisor.run.workerproc import WorkerHandle, WorkerState
from supervisor.units import format_duration, format_size

PERIOD = 0.02  # seconds between watchdog passes while a job runs


def inspect(
    workers: Iterable[WorkerHandle], pools: Mapping[str, PoolConfig], now: float
) -> list[tuple[WorkerHandle, KillReason]]:
    """Orders for busy workers past their deadline or memory limit. A ``soft_timeout`` order
    means "signal the handler" (``SoftTimeout``); every other order means SIGKILL."""
    orders: list[tuple[WorkerHandle, KillReason]] = []
    for worker in workers:
        job = worker.job
        if worker.state != WorkerState.BUSY or job is None or worker.kill_reason is not None:
            continue
        config = pools[worker.pool]
        if now >= job.deadline:
            orders.append((worker, _deadline_order(worker, config, now)))
            continue
        limit = config.memory_limit
        if limit is None:
            continue
        rss = worker.rss()
        if rss is not None:
            worker.last_rss = max(worker.last_rss or 0, rss)
        if rss is not None and rss > limit:
            detail = (
                f"worker RSS {format_size(rss)} passed memory_limit {format_size(limit)} "
                f"(peak seen {format_size(worker.last_rss or rss)}); stopped by the watchdog"
            )
            orders.append((worker, KillReason(KillKind.MEMORY_LIMIT, detail)))
    return orders


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
