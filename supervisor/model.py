"""The nouns of the queue: job states, error kinds, and the frozen values store verbs take and
return. Pure data; no I/O.

The lease state machine (docs/architecture.md draws it)::

    enqueue ─> queued ─claim─> leased ─ack─> done
                 ^  ^            │
                 │  └─ release ──┤   drain: visible at once, the delivery not counted
                 └── retry ──────┤   failure with attempts < max_deliveries, after backoff
                                 └─> dead   attempts reached max_deliveries, or permanent
    queued ─cancel─> cancelled          at once (waiting, or between retries)
    leased ─cancel─> (cancel requested) ─any end of the delivery─> cancelled
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    QUEUED = "queued"  # in: enqueue, release, retry, reap, dlq requeue. out: claim.
    LEASED = "leased"  # in: claim only. out: ack, fail, release, reap (all guarded by token).
    DONE = "done"  # in: ack. out: prune after the retention.
    DEAD = "dead"  # in: fail at the limit or permanent, reap at the limit. out: requeue, purge.
    # in: cancel of a queued job; any end (ack, fail, release, reap) of a leased job whose
    # cancel was requested. out: prune after the retention. Final: never run again.
    CANCELLED = "cancelled"


FINAL_STATES = frozenset({JobState.DONE, JobState.DEAD, JobState.CANCELLED})


class ErrorKind(StrEnum):
    MEMORY_LIMIT = "memory_limit"  # RSS over memory_limit, or MemoryError under the rlimit
    TIMEOUT = "timeout"  # wall clock past timeout, or the lease-extension ceiling reached
    CRASHED = "crashed"  # the worker died on its own: exit code or signal
    EXCEPTION = "exception"  # the handler raised
    PERMANENT = "permanent"  # the handler raised workers.Permanent: dead at once
    LEASE_EXPIRED = "lease_expired"  # nobody extended the lease in time (reaper)


# What the store's columns hold (supervisor/store/schema.py), so config and the client refuse a
# value up front instead of PostgreSQL at the first write (SQLite stores longer text as it is).
NAME_MAX = 200  # characters of a tenant, a kind, a pool or a schedule name (varchar(200))
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1  # a job's priority (int4)


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job about to be enqueued. ``payload`` is already-validated JSON text."""

    kind: str
    pool: str
    payload: str
    max_deliveries: int
    tenant: str | None = None
    key: str | None = None
    priority: int = 0
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof of ownership: every write after a claim names the job and its lease token."""

    job_id: int
    token: str

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as a call with its fields: leases cross the store link in every extend,
        # release and lost-lease reply, and a frozen slots dataclass's own way (its state set
        # field by field in Python) took 7.9 µs a lease there and back, this 3.4 µs
        return (Lease, (self.job_id, self.token))


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job just claimed: what a worker needs to run it and what the parent needs to keep it."""

    lease: Lease
    kind: str
    pool: str
    payload: str
    attempt: int
    max_deliveries: int
    locked_until: float
    tenant: str | None = None

    @property
    def job_id(self) -> int:
        return self.lease.job_id


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """Fleet-wide caps on leased jobs, checked inside the claim's transaction: per pool, per
    tenant (jobs without a tenant share one), per kind. None (or a kind not listed) means no
    cap. A claim given limits also orders jobs fairly between tenants (docs/architecture.md).

    ``fair`` and ``weights`` (a tenant's weight, 1 when not listed) order the claim between
    tenants: a capped claim always does; an uncapped one does while ``fair`` holds and the
    pool's queue holds more than one tenant (supervisor/store/fair.py)."""

    max_inflight: int | None = None
    tenant_max_inflight: int | None = None
    kind_max_inflight: Mapping[str, int] = field(default_factory=dict)
    fair: bool = True
    weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def capped(self) -> bool:
        """True when any cap is set (otherwise the plain claim serves)."""
        return (
            self.max_inflight is not None
            or self.tenant_max_inflight is not None
            or bool(self.kind_max_inflight)
        )

    def weight(self, tenant: str) -> float:
        """The tenant's weight (1 unless ``weights`` names it)."""
        return self.weights.get(tenant, 1.0)


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """A pool's fleet-wide retry budget: over the last ``window`` seconds, retries may be at
    most ``max(floor, ratio × deliveries)``. Past it, a failed job is not retried at once but
    deferred by ``window`` plus its normal delay; it is never dropped. The counters live in the
    database, shared by every host."""

    ratio: float
    floor: int = 10
    window: float = 300.0

    def allows(self, retries: int, deliveries: int) -> bool:
        """Whether one more retry fits, ``retries`` already made over ``deliveries``.

        >>> RetryBudget(0.1).allows(9, 0), RetryBudget(0.1).allows(10, 0)
        (True, False)
        >>> RetryBudget(0.1).allows(19, 200), RetryBudget(0.1).allows(20, 200)
        (True, False)
        """
        return retries + 1 <= max(float(self.floor), self.ratio * deliveries)


@dataclass(frozen=True, slots=True)
class Ack:
    """A successful result. ``result`` is JSON text."""

    lease: Lease
    result: str = "null"
    peak_rss: int | None = None
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed delivery. ``retry_delay`` None means dead-letter now (permanent); otherwise the
    store retries after that many seconds, or dead-letters when attempts reached the limit."""

    lease: Lease
    error_kind: ErrorKind | None  # None: stopped at an operator's request (a cancel)
    message: str
    retry_delay: float | None
    peak_rss: int | None = None
    duration: float | None = None
    budget: RetryBudget | None = None  # the pool's retry budget, if it has one


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """What ``Store.fail`` did with each failure that still held its lease."""

    retried: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    lost: tuple[Lease, ...] = ()  # the lease was no longer ours: nothing changed
    deferred: tuple[int, ...] = ()  # of retried: past the pool's retry budget, deferred longer
    cancelled: tuple[int, ...] = ()  # its cancel was requested: cancelled, never retried


@dataclass(frozen=True, slots=True)
class ReapOutcome:
    """Expired leases the reaper handled: back to queued, or dead at the delivery limit."""

    requeued: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    # job id -> the attempt whose lease expired (a requeued job may be claimed again at once,
    # by this node or another, before anyone reads its row)
    attempts: dict[int, int] = field(default_factory=dict)
    cancelled: tuple[int, ...] = ()  # its cancel was requested: cancelled, not requeued

    @property
    def count(self) -> int:
        return len(self.requeued) + len(self.dead) + len(self.cancelled)


@dataclass(frozen=True, slots=True)
class PoolStats:
    """One pool's queue figures, read from the store. Each count stops at ``STATS_CAP``
    (``capped`` says when one did): the supervisor reads these every second, and an exact
    count of a million rows costs the database half a second."""

    pool: str
    ready: int = 0  # queued and available now
    scheduled: int = 0  # queued, available later (delay or retry backoff)
    leased: int = 0
    done: int = 0
    dead: int = 0
    cancelled: int = 0  # until pruned with the done jobs, after the retention
    oldest_ready_age: float = 0.0  # seconds the oldest ready job has waited; 0 when none
    capped: bool = False  # some count reached STATS_CAP: read it as "at least"


STATS_CAP = 10_000


@dataclass(frozen=True, slots=True)
class PoolHistory:
    """A pool's recent completions, for sizing: how many finished in the window, and the
    durations and peak RSS of the most recent of them."""

    completed: int = 0
    durations: tuple[float, ...] = ()
    peaks: tuple[int, ...] = ()


def iso(ts: float | None) -> str | None:
    """Unix seconds as ISO 8601 in UTC, or None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Job:
    """A job row as users see it (``client.get``, ``fleetd jobs``)."""

    id: int
    kind: str
    pool: str
    state: JobState
    attempts: int
    max_deliveries: int
    payload: Any
    tenant: str | None
    key: str | None
    priority: int
    enqueued_at: float
    available_at: float
    started_at: float | None
    finished_at: float | None
    result: Any
    last_error: str | None
    error_kind: ErrorKind | None
    peak_rss: int | None
    duration: float | None
    owner: str | None = None
    locked_until: float | None = None
    extensions: int = 0
    cancel_requested_at: float | None = None  # a cancel asked while it was leased
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The contract's JSON shape: timestamps ISO 8601 in UTC."""
        return {
            "id": self.id,
            "kind": self.kind,
            "pool": self.pool,
            "state": str(self.state),
            "attempts": self.attempts,
            "max_deliveries": self.max_deliveries,
            "tenant": self.tenant,
            "key": self.key,
            "priority": self.priority,
            "payload": self.payload,
            "enqueued_at": iso(self.enqueued_at),
            "available_at": iso(self.available_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "result": self.result,
            "last_error": self.last_error,
            "error_kind": str(self.error_kind) if self.error_kind else None,
            "peak_rss": self.peak_rss,
            "duration": self.duration,
            "owner": self.owner,
            "locked_until": iso(self.locked_until),
            "cancel_requested_at": iso(self.cancel_requested_at),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


# ---- operator controls (supervisor/store/controls.py stores; fleetd cancel, pause, dlq) ----


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a bulk action touches: every given field must match. ``states`` None means
    the action's own default; ``since`` is seconds back from the store's now, compared with
    the job's ``finished_at`` (dead letters) or ``enqueued_at`` (anything else)."""

    kind: str | None = None
    tenant: str | None = None
    pool: str | None = None
    states: tuple[JobState, ...] | None = None
    error_kind: ErrorKind | None = None
    since: float | None = None

    @property
    def empty(self) -> bool:
        """No field given: a filter that would match every job of its states."""
        return all(v is None for v in (self.kind, self.tenant, self.pool, self.error_kind))


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What ``Store.cancel`` did. ``cancelled``: queued jobs now cancelled (never run again);
    ``requested``: leased jobs whose cancel is now recorded (the supervisor holding the lease
    stops them; any end of that delivery is ``cancelled``), with the node holding each;
    ``unchanged``: jobs already final (done, dead, cancelled), with their state."""

    cancelled: tuple[int, ...] = ()
    requested: dict[int, str | None] = field(default_factory=dict)
    unchanged: dict[int, JobState] = field(default_factory=dict)

    @property
    def took(self) -> bool:
        return bool(self.cancelled or self.requested)


@dataclass(frozen=True, slots=True)
class Pause:
    """A pool (``kind`` None) or one kind of it that no supervisor starts jobs of."""

    pool: str
    kind: str | None
    since: float  # Unix seconds

    def covers(self, kind: str) -> bool:
        return self.kind is None or self.kind == kind


@dataclass(frozen=True, slots=True)
class ControlState:
    """What one supervisor reads every fraction of a second (``Store.controls``): the pauses
    in force, and the leases it holds whose cancel was requested."""

    pauses: tuple[Pause, ...] = ()
    cancels: tuple[Lease, ...] = ()


# ---- schedules (supervisor/schedules.py decides, supervisor/store/schedule_table.py stores) ----


@dataclass(frozen=True, slots=True)
class TickJob:
    """A recent tick of a schedule and its job as the store holds it now (``state`` None: the
    job row is gone, pruned after the retention or purged)."""

    tick: float  # Unix seconds
    job_id: int
    state: JobState | None = None
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule's row: what every supervisor decides its ticks from.

    ``through``: every tick at or before it has been decided (enqueued, or missed or skipped by
    the schedule's policies); a schedule seen for the first time starts at that moment, so
    nothing is backfilled. ``timing``: the timing those ticks are decided by
    (``Timing.fingerprint``), set at ``timing_at``. ``recent``: the last ticks enqueued,
    oldest first."""

    name: str
    created_at: float
    through: float
    timing: str = ""
    timing_at: float = 0.0
    last_tick: float | None = None
    last_job_id: int | None = None
    missed: int = 0  # ticks never enqueued (catch_up or overlap), fleet-wide, since created
    last_success_at: float | None = None  # when a tick's job last finished done
    recent: tuple[TickJob, ...] = ()

    @property
    def last(self) -> TickJob | None:
        """The latest tick enqueued, with its job's state."""
        return self.recent[-1] if self.recent else None

    def busy(self) -> bool:
        """Whether the last tick's job is queued (waiting, or for a retry) or leased."""
        last = self.last
        return last is not None and last.state in (JobState.QUEUED, JobState.LEASED)

    def latest_success(self) -> float | None:
        """The latest finish of a done job: the row's, or one of the recent ticks'."""
        done = [t.finished_at for t in self.recent if t.state == JobState.DONE and t.finished_at]
        return max([*done, *filter(None, [self.last_success_at])], default=None)


@dataclass(frozen=True, slots=True)
class ScheduleRead:
    """Schedule rows as read at ``now`` (the store's clock: the database's on PostgreSQL)."""

    now: float
    states: dict[str, ScheduleState] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScheduleAdvance:
    """One decision about a schedule, written in one transaction by ``Store.advance_schedule``:
    move ``through`` from ``expected`` to ``through`` (a compare-and-set: it takes only if the
    row still says ``expected`` and still has the ``timing`` the ticks were planned by),
    enqueue ``jobs`` (their ticks, with their keyed jobs), and add ``missed`` to the row's
    count of ticks never enqueued."""

    name: str
    expected: float
    through: float
    jobs: tuple[tuple[float, NewJob], ...] = ()
    missed: int = 0
    timing: str = ""

    def __post_init__(self) -> None:
        if not self.through > self.expected:  # a decided tick is never decided again
            raise ValueError(f"schedule {self.name}: through goes back or stays ({self})")
        if self.missed < 0:
            raise ValueError(f"schedule {self.name}: a negative missed count ({self})")


@dataclass(frozen=True, slots=True)
class AdvanceOutcome:
    """Whether the advance took (False: another supervisor decided these ticks first, and
    nothing was written), the job id of each tick enqueued, and the ticks whose idempotency
    key named a job that was there already (enqueued by hand, or a restored database): that
    job is the tick's, and no second one was made."""

    took: bool
    enqueued: tuple[tuple[float, int], ...] = ()
    adopted: tuple[float, ...] = ()
