"""Logging: human lines by default, one JSON object a line with ``log_format = "json"``, on
stderr (systemd's journal and Kubernetes collect it there).

Job outcomes that are not plain success (a failed delivery, a dead letter, a success that
needed more than one delivery) are logged once each through ``job_event`` with the same fields
in both formats: job id, pool, kind, attempt, duration, peak RSS, error kind. In JSON they are
keys of the object, so a log pipeline can count and filter without parsing sentences::

    {"ts": "2026-12-02T17:10:53.120Z", "level": "INFO", "logger": "fleetd.dispatch",
     "msg": "job 12 render attempt 1/3 failed: memory_limit: worker RSS ...",
     "event": "job_failed", "job_id": 12, "pool": "bulk", "kind": "render", "attempt": 1,
     "max_deliveries": 3, "duration": 0.84, "peak_rss": 272629760,
     "error_kind": "memory_limit"}
"""

from __future__ import annotations

import logging

from workers.logs import HUMAN_FORMAT, JOB_FIELDS, JsonFormatter, setup_logging

__all__ = ["HUMAN_FORMAT", "JOB_FIELDS", "JsonFormatter", "job_event", "setup_logging"]


def _size(n: int | None) -> str:
    return "-" if n is None else f"{n / (1024 * 1024):.0f}MiB"


LOGGED_MESSAGE = 500  # characters of a job's error message in its log line


def job_event(
    log: logging.Logger,
    level: int,
    event: str,
    *,
    job_id: int,
    pool: str,
    kind: str | None,
    attempt: int | None,
    max_deliveries: int | None,
    duration: float | None,
    peak_rss: int | None,
    error_kind: str | None,
    message: str,
) -> None:
    """One line for one job outcome: ``job_failed``, ``job_dead`` or ``job_recovered``."""
    took = "-" if duration is None else f"{duration:.2f}s"
    if len(message) > LOGGED_MESSAGE:  # the job row keeps it whole (up to 4,000 characters)
        message = message[:LOGGED_MESSAGE] + " [...]"
    of = f"/{max_deliveries}" if max_deliveries else ""
    text = (
        f"job {job_id} {kind or '?'} (pool {pool}) attempt {attempt or '?'}{of} {event[4:]}"
        f" after {took}, peak RSS {_size(peak_rss)}"
        + (f": {error_kind}: {message}" if error_kind else (f": {message}" if message else ""))
    )
    log.log(
        level,
        text,
        extra={
            "event": event,
            "job_id": job_id,
            "pool": pool,
            "kind": kind,
            "attempt": attempt,
            "max_deliveries": max_deliveries,
            "duration": duration,
            "peak_rss": peak_rss,
            "error_kind": error_kind,
        },
    )
