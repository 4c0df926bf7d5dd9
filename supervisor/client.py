"""``Client``: how applications put jobs in and read them back.

Payloads and results are JSON only, never pickle: a job row must not be able to choose code.
Everything is checked before anything is written, so a bad item in ``enqueue_many`` leaves the
queue untouched.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self

from supervisor.clock import Clock
from supervisor.config import load_config
from supervisor.config.fleet import FleetConfig
from supervisor.errors import JobNotFound, PayloadError
from supervisor.model import FINAL_STATES, PRIORITY_MAX, PRIORITY_MIN, Job, NewJob
from supervisor.store import Store, open_store
from supervisor.units import parse_duration

_ITEM_KEYS = {"kind", "payload", "tenant", "key", "priority", "delay"}
# wait: the reads a waiter makes besides its wake-ups (a wake-up lost, a sender that crashed)
SAFETY_POLL = 1.0
# ... and its polling where nothing can wake it: 2 ms, then 1.5x per read, up to 0.25 s
FALLBACK_POLL = 0.002
FALLBACK_POLL_MAX = 0.25


class Client:
    """Enqueue jobs and read them back, against the database a fleet.toml names."""

    def __init__(self, config: FleetConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store if store is not None else open_store(config.database)

    @classmethod
    def from_config(
        cls, path: str | Path | FleetConfig, *, clock: Clock | None = None, create: bool = True
    ) -> Self:
        """A client for the fleet described by a fleet.toml (or an already loaded config).
        ``create=False``: a SQLite database that does not exist yet is an error (StoreError)
        rather than created empty."""
        config = path if isinstance(path, FleetConfig) else load_config(path)
        return cls(config, open_store(config.database, clock, create=create))

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def enqueue(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        tenant: str | None = None,
        key: str | None = None,
        priority: int = 0,
        delay: float | str = 0,
    ) -> int:
        """Add one job and return its id. An existing ``key`` of the same kind returns that
        job's id and changes nothing."""
        new = self.new_job(kind, payload, tenant=tenant, key=key, priority=priority, delay=delay)
        return self.store.enqueue(new)

    def enqueue_many(
        self, items: Iterable[tuple[str, Mapping[str, Any]] | Mapping[str, Any]]
    ) -> list[int]:
        """Add many jobs in one transaction; ids in input order. Items are ``(kind, payload)``
        tuples or dicts with kind, payload, tenant, key, priority, delay."""
        return self.store.enqueue_many([self._item(i, item) for i, item in enumerate(items)])

    def get(self, job_id: int) -> Job:
        """The job as it is now; ``JobNotFound`` if there is no such job."""
        job = self.store.get(job_id)
        if job is None:
            raise JobNotFound(f"no job with id {job_id}")
        return job

    def cancel(self, job_id: int) -> bool:
        """Cancel a job. A queued one (waiting, or between retries) is cancelled at once and
        never runs; a running one is stopped within a second by the supervisor holding its
        lease, on any host, and ends cancelled. True when the cancel took (cancelled, or
        requested for a running job); False when the job was final already (done, dead,
        cancelled): nothing changed. ``JobNotFound`` when there is no such job."""
        return self.store.cancel([job_id]).took

    def wait(self, job_id: int, timeout: float = 30.0, *, poll: float = SAFETY_POLL) -> Job:
        """Return the job once it is final (done, dead or cancelled); ``TimeoutError``
        after ``timeout`` s, ``JobNotFound`` when there is no such job (never enqueued, or
        deleted: a purged dead letter, a pruned done job).

        It is woken by whoever makes the job final (NOTIFY on PostgreSQL; a datagram from
        this host's supervisor on SQLite), and reads the job again every ``poll`` s anyway,
        in case a wake-up was lost. Where it cannot be woken (SQLite with no supervisor of
        this user on this host, a socket it cannot bind) it polls, every 2 ms growing to
        0.25 s."""
        job = self.wait_all([job_id], timeout, poll=poll, partial=True)[0]
        if job.state not in FINAL_STATES:
            raise TimeoutError(f"job {job_id} is still {job.state} after {timeout}s")
        return job

    def wait_all(
        self,
        job_ids: Iterable[int],
        timeout: float = 30.0,
        *,
        poll: float = SAFETY_POLL,
        partial: bool = False,
    ) -> list[Job]:
        """``wait`` for several jobs at once, one registration for all: the jobs in the order
        given once every one is final. When ``timeout`` runs out first: ``TimeoutError``
        naming the jobs not final, or with ``partial`` the jobs as they are then."""
        ids = list(job_ids)
        if not poll > 0:
            raise ValueError(f"poll must be more than 0 seconds, not {poll!r}")
        deadline = time.monotonic() + timeout
        # registered before the first read: nothing slips
        watch = self.store.final_watch(within=timeout)
        try:
            jobs = self._settle(ids, deadline, watch, poll)
        finally:
            if watch is not None:
                watch.close()
        late = [j for j in jobs.values() if j.state not in FINAL_STATES]
        if late and not partial:
            named = ", ".join(f"{j.id} ({j.state})" for j in sorted(late, key=lambda j: j.id))
            raise TimeoutError(f"not final after {timeout}s: job {named}")
        return [jobs[i] for i in ids]

    def _settle(self, ids: list[int], deadline: float, watch: Any, poll: float) -> dict[int, Job]:
        """Read the jobs, then read again those a wake-up names (or all, when a wake-up cannot
        say which, or ``poll`` s passed) until all are final or ``deadline``."""
        jobs = {i: self.get(i) for i in ids}
        pending = {i for i, j in jobs.items() if j.state not in FINAL_STATES}
        step = FALLBACK_POLL
        poll_at = time.monotonic() + (poll if watch is not None else step)
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            if watch is not None and watch.broken:
                watch = None  # the channel is gone: poll from here on
            if watch is None:
                time.sleep(max(0.0, min(poll_at, deadline) - now))
                woken = None
            else:
                woken = watch.wait(min(poll_at, deadline) - now)
            now = time.monotonic()
            if now >= poll_at or woken is None:
                again = set(pending)
                if watch is None:
                    step = min(step * 1.5, FALLBACK_POLL_MAX)
                poll_at = now + (poll if watch is not None else step)
            else:
                again = pending & woken
            for i in again:
                jobs[i] = self.get(i)
                if jobs[i].state in FINAL_STATES:
                    pending.discard(i)
        return jobs

    def new_job(
        self,
        kind: str,
        payload: Mapping[str, Any] | None,
        *,
        tenant: str | None = None,
        key: str | None = None,
        priority: int = 0,
        delay: float | str = 0,
    ) -> NewJob:
        """Validate one job's fields and route its kind to its pool, writing nothing."""
        pool = self.config.pool_for_kind(kind)
        return NewJob(
            kind=kind,
            pool=pool.name,
            payload=encode_payload(payload),
            max_deliveries=pool.max_deliveries,
            tenant=_optional_text("tenant", tenant),
            key=_optional_text("key", key),
            priority=_priority(priority),
            delay=_delay(delay),
        )

    def _item(self, index: int, item: Any) -> NewJob:
        try:
            if isinstance(item, Mapping):
                unknown = set(item) - _ITEM_KEYS
                if unknown or "kind" not in item:
                    raise PayloadError(
                        f"expected keys {sorted(_ITEM_KEYS)} with 'kind'; got {sorted(item)}"
                    )
                fields = dict(item)
                return self.new_job(fields.pop("kind"), fields.pop("payload", None), **fields)
            kind, payload = item
            return self.new_job(kind, payload)
        except (PayloadError, ValueError, TypeError) as exc:
            raise PayloadError(f"item {index}: {exc}") from exc


def encode_payload(payload: Any) -> str:
    """A payload as compact JSON text; it must be a JSON object (None means {})."""
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise PayloadError(f"payload must be a JSON object, not {type(payload).__name__}")
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from exc


def _optional_text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PayloadError(f"{name} must be a non-empty string, not {value!r}")
    return value


def _priority(value: Any) -> int:
    """An integer the database's column holds (PostgreSQL's int4; SQLite would overflow
    past 2**63 with a driver error instead)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (PRIORITY_MIN <= value <= PRIORITY_MAX)
    ):
        raise PayloadError(
            f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, not {value!r}"
        )
    return value


def _delay(value: Any) -> float:
    try:
        seconds = parse_duration(value) if isinstance(value, str) else float(value)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"delay: {exc}") from exc
    if not math.isfinite(seconds) or seconds < 0:
        raise PayloadError(f"delay must be zero or more seconds, not {value!r}")
    return seconds
