"""Between the job table's rows and the model: what a claim returns and in which order, a row
as a ``Job``, and the bound values the verbs send.

A claim's row is read by position, not by name: the uncapped claim's rows come straight from
the driver as tuples (``driver.fetchall``), the capped claim's as SQLAlchemy rows, and
``CLAIMED_COLUMNS`` fixes one order for both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Float, bindparam, tuple_

from supervisor.model import Claimed, ErrorKind, Job, JobState, Lease, NewJob
from supervisor.store.schema import jobs

BATCH = 500  # rows per statement for id lists (well under SQLite's bound-variable limit)
TIME = Float(precision=53)  # the type of a bound time or duration: Unix seconds, as stored

# What a claim returns of each job it leased. The first nine columns are Claimed's fields in
# order, the lease's two first (``as_claimed``).
CLAIMED_COLUMNS = (
    jobs.c.id,
    jobs.c.lease_token,
    jobs.c.kind,
    jobs.c.pool,
    jobs.c.payload,
    jobs.c.attempts,
    jobs.c.max_deliveries,
    jobs.c.locked_until,
    jobs.c.tenant,
    jobs.c.priority,
    jobs.c.available_at,
    jobs.c.started_at,  # the claim's "now" (retry-budget bucket)
)

# Where each column sits in a claim's row (a driver tuple or a SQLAlchemy Row alike)
_AT = {column.name: i for i, column in enumerate(CLAIMED_COLUMNS)}
CLAIMED_AT = _AT["started_at"]  # the claim's "now"
_PRIORITY, _AVAILABLE, _ID = _AT["priority"], _AT["available_at"], _AT["id"]

# (id, token) IN (...), filled by ``lease_pairs``: row values work on PostgreSQL and on
# SQLite >= 3.15. An expanding parameter keeps one compiled statement whatever the number of
# leases.
LEASES_MATCH = tuple_(jobs.c.id, jobs.c.lease_token).in_(bindparam("leases", expanding=True))

# A delivery whose cancel was requested ends cancelled, whatever ended it (controls.py)
CANCEL_ASKED = jobs.c.cancel_requested_at.is_not(None)


def claim_order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A claim's rows in the order they were chosen: highest priority, then longest waiting
    (an UPDATE's RETURNING rows come in no guaranteed order)."""
    return (-row[_PRIORITY], row[_AVAILABLE], row[_ID])


# A claimed job as a plain tuple: Claimed's fields in order, the lease's two first. What a
# claim's row becomes without building objects (a store process sends these over a socket).
ClaimRow = tuple[int, str, str, str, str, int, int, float, str | None]


def claim_row(row: Any) -> ClaimRow:
    """A claim's row (``CLAIMED_COLUMNS``) cut to ``ClaimRow``."""
    return tuple(row[:9])  # type: ignore[return-value]


def as_claimed(row: Any) -> Claimed:
    """A claim's row (``CLAIMED_COLUMNS``, or a ``ClaimRow``) as the model's ``Claimed``."""
    return Claimed(Lease(row[0], row[1]), *row[2:9])


def as_job(row: Any) -> Job:
    """A full row of the job table as the model's ``Job`` (payload and result decoded)."""
    m = row._mapping
    return Job(
        id=m["id"],
        kind=m["kind"],
        pool=m["pool"],
        state=JobState(m["state"]),
        attempts=m["attempts"],
        max_deliveries=m["max_deliveries"],
        payload=json.loads(m["payload"]),
        tenant=m["tenant"],
        key=m["key"],
        priority=m["priority"],
        enqueued_at=m["enqueued_at"],
        available_at=m["available_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        result=None if m["result"] is None else json.loads(m["result"]),
        last_error=m["last_error"],
        error_kind=ErrorKind(m["error_kind"]) if m["error_kind"] else None,
        peak_rss=m["peak_rss"],
        duration=m["duration"],
        owner=m["owner"],
        locked_until=m["locked_until"],
        extensions=m["extensions"],
        cancel_requested_at=m.get("cancel_requested_at"),
    )


def job_params(job: NewJob) -> dict[str, Any]:
    """The bound values of one job's insert (``Enqueues._row_values`` names them)."""
    return {
        "kind": job.kind,
        "pool": job.pool,
        "payload": job.payload,
        "tenant": job.tenant,
        "key": job.key,
        "priority": job.priority,
        "max_deliveries": job.max_deliveries,
        "delay": float(job.delay),
    }


def lease_pairs(leases: Sequence[Lease]) -> list[tuple[int, str]]:
    """The ``leases`` parameter of ``LEASES_MATCH``."""
    return [(x.job_id, x.token) for x in leases]


T = TypeVar("T")


def chunks(ids: Sequence[T]) -> Iterator[Sequence[T]]:
    """``ids`` (or leases: two bound values each) in slices of at most ``BATCH``, one
    statement each."""
    for start in range(0, len(ids), BATCH):
        yield ids[start : start + BATCH]
