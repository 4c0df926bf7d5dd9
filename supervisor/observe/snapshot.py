"""``FleetSnapshot``: one supervisor, frozen, once per publish tick. The single read model.

    live objects (pools, workers, counters, drain, store figures)
          │  observe.observer.Observer.build()   (once a second, in the loop)
          v
    FleetSnapshot ──to_json()──> node table (the ``snapshot`` column; ``fleetd status`` reads it)
          ├──> observe.metrics   (/metrics renders it; nothing else is read)
          ├──> observe.health    (/healthz and ``fleetd check --live`` judge it)
          └──> observe.fleetview (``fleetd status``, ``--json``)

Everything here is plain data: numbers, strings, tuples. Durations are seconds, sizes bytes,
``*_at`` Unix seconds; ages are measured by the supervisor when it built the snapshot. The JSON
shape is versioned by ``SCHEMA``; ``from_dict`` reads what ``to_dict`` wrote (and tolerates keys
it does not know, so a newer supervisor's rows do not break an older ``fleetd status``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA = 1
RECENT_WINDOW = 300.0  # seconds covered by the "recent" figures (redeliveries, dead letters...)

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
_MIB = 1024 * 1024
RSS_BUCKETS = tuple(float(m * _MIB) for m in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192))


@dataclass(frozen=True, slots=True)
class HistogramData:
    """A cumulative histogram as Prometheus wants it: counts per upper bound (the last bound
    is +Inf), their sum and count, since the supervisor started."""

    bounds: tuple[float, ...]  # finite upper bounds; +Inf is implied after them
    counts: tuple[int, ...]  # per bucket, not cumulative; len(bounds) + 1
    total: float = 0.0
    count: int = 0

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> HistogramData:
        return cls(bounds, (0,) * (len(bounds) + 1))

    def cumulative(self) -> list[tuple[str, int]]:
        """``[("0.01", n), ..., ("+Inf", count)]``: the ``le`` buckets."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as the parent sees it."""

    pool: str
    slot: int
    pid: int
    state: str  # starting, idle, busy, stopping
    job: int | None = None  # the job id it runs
    kind: str | None = None
    attempt: int | None = None
    elapsed: float | None = None  # seconds since the job was sent
    tenant: str | None = None  # the job's tenant (the live view's filter and its cancel line)
    timeout: float = 0.0  # the pool's timeout (the job's deadline is elapsed = timeout)
    rss: int | None = None  # bytes, latest reading (watchdog while busy, Pong while idle)
    age: float = 0.0  # seconds since the fork
    jobs_done: int = 0
    kill: str | None = None  # why the parent killed it (memory_limit, timeout, wedged...)
    killed_for: float | None = None  # seconds since that SIGKILL was sent
    ping_wait: float | None = None  # seconds an unanswered Ping has waited
    running: int = 0  # jobs it runs now (``job`` is the oldest); up to ``slots``
    slots: int = 1  # jobs it runs at once (workers/slots.py)

    @property
    def name(self) -> str:
        return f"{self.pool}#{self.slot}"


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool on one supervisor: its workers, its sizing, its queue and what it did."""

    name: str
    kinds: tuple[str, ...] = ()
    bound: str = "cpu"
    slots: int = 1  # jobs one worker runs at once
    workers: tuple[WorkerView, ...] = ()
    # sizing (the scaler's figures when it runs; otherwise target and max_workers)
    target: int = 0
    desired: int = 0
    ceiling: int = 0
    binding: str = "max_workers"
    saturated: bool = False
    min_workers: int = 0
    max_workers: int = 0
    # limits, from the config
    timeout: float = 0.0
    soft_timeout: float = 0.0
    memory_limit: int | None = None
    latency_target: float = 0.0
    ping_timeout: float = 0.0  # an idle worker's Pong later than this: wedged
    progress_window: float = 0.0  # ready work and nothing finished for this long: stalled
    # the queue, from the store (fleet-wide: every node of the pool reads the same rows)
    ready: int | None = None  # None: not read yet (store unreachable since start)
    scheduled: int | None = None
    leased: int | None = None
    dead: int | None = None
    cancelled: int | None = None  # cancelled jobs kept until the retention
    oldest_age: float = 0.0
    counts_capped: bool = False  # a count reached the store's cap: read it as "at least"
    arrival_rate: float = 0.0  # jobs enqueued per second, last minute (fleet-wide)
    # paused fleet-wide (fleetd pause), as this node last read it: every kind, or these kinds
    paused: bool = False
    paused_kinds: tuple[str, ...] = ()
    # rate limits (per second, fleet-wide; None: none) and whether this node's last claim
    # left ready jobs queued for want of a token ("held by rate")
    rate_limit: float | None = None
    kind_rate_limit: dict[str, float] = field(default_factory=dict)
    rate_held: bool = False
    # this node's work
    throughput: float = 0.0  # jobs finished per second here, last minute (any outcome)
    duration_p50: float | None = None  # seconds, jobs finished here in the recent window
    duration_p95: float | None = None
    peak_rss_p95: int | None = None  # bytes
    # a worker at rest as the kernel counts it (smaps_rollup of one ready worker): the pages
    # every worker shares (counted once per pool by the sizing) and those it has alone
    shared_baseline: int | None = None
    private_at_rest: int | None = None
    stalled_for: float | None = None  # ready work waiting with no completion here for so long
    recent: dict[str, int] = field(default_factory=dict)  # last RECENT_WINDOW seconds
    # cumulative since this supervisor started (metrics)
    enqueued: int = 0
    redeliveries: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # outcome -> count
    dead_letters: dict[str, int] = field(default_factory=dict)  # error_kind -> count
    kills: dict[str, int] = field(default_factory=dict)  # reason -> count
    duration: HistogramData = field(default_factory=lambda: HistogramData.empty(DURATION_BUCKETS))
    peak_rss: HistogramData = field(default_factory=lambda: HistogramData.empty(RSS_BUCKETS))

    def count(self, state: str) -> int:
        return sum(1 for w in self.workers if w.state == state)

    @property
    def running(self) -> int:
        """Jobs running here: one per busy slot (a worker of one slot runs one)."""
        return sum(w.running for w in self.workers)

    @property
    def busy(self) -> int:
        return self.count("busy")

    @property
    def idle(self) -> int:
        return self.count("idle")


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One schedule as this supervisor's last pass saw it. The row's figures (last tick,
    success, missed) are fleet-wide; ``ticks`` counts what this node decided, by outcome
    (on_time, late: enqueued by catch-up, missed: not enqueued by catch_up, skipped: by
    overlap)."""

    name: str
    kind: str = ""
    timing: str = ""  # 'every 5s' or 'cron "0 2 * * *" (Europe/Paris)'
    policies: str = ""
    last_tick: float | None = None  # Unix seconds of the latest tick enqueued
    last_job: int | None = None
    last_state: str | None = None  # its job's state; None: not read, or the row is gone
    last_success_at: float | None = None
    next_tick: float | None = None
    late_for: float = 0.0  # seconds a due tick has waited past its grace, undecided
    missed: int = 0  # ticks never enqueued, fleet-wide, since the schedule was first seen
    ticks: dict[str, int] = field(default_factory=dict)
    error: str | None = None  # why this node's passes do not enqueue it (refused, failing)


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """One supervisor at one instant (its node row's ``snapshot``)."""

    node_id: str
    hostname: str
    pid: int
    fleet: str
    state: str = "running"  # running, draining
    taken_at: float = 0.0  # Unix seconds
    started_at: float = 0.0
    store_ok: bool = True
    store_failures: int = 0  # store calls failed in a row (0: reachable)
    store_wait: float | None = None  # seconds the oldest unanswered store call has waited
    figures_age: float | None = None  # seconds since the queue figures were read
    pending_writes: int = 0
    lease_expiries: int = 0  # cumulative: expired leases this node's reaper returned
    releases: int = 0
    lost_leases: int = 0
    store_errors: int = 0
    boot_failures: int = 0
    recent_lease_expiries: int = 0
    pools: dict[str, PoolView] = field(default_factory=dict)
    schedules: dict[str, ScheduleView] = field(default_factory=dict)
    schema: int = SCHEMA

    @property
    def uptime(self) -> float:
        return max(0.0, self.taken_at - self.started_at)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetSnapshot:
        pools = {name: _pool_from_dict(name, p) for name, p in (data.get("pools") or {}).items()}
        schedules = {
            name: ScheduleView(**{**_known(ScheduleView, s), "name": name})
            for name, s in (data.get("schedules") or {}).items()
            if isinstance(s, dict)
        }
        return cls(**{**_known(cls, data), "pools": pools, "schedules": schedules})

    @classmethod
    def from_json(cls, text: str) -> FleetSnapshot:
        return cls.from_dict(json.loads(text))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that ``cls`` has (a newer writer may add more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _histogram(data: Any, bounds: tuple[float, ...]) -> HistogramData:
    if not isinstance(data, dict):
        return HistogramData.empty(bounds)
    return HistogramData(
        tuple(data.get("bounds", bounds)),
        tuple(data.get("counts", (0,) * (len(bounds) + 1))),
        float(data.get("total", 0.0)),
        int(data.get("count", 0)),
    )


def _pool_from_dict(name: str, data: dict[str, Any]) -> PoolView:
    values = _known(PoolView, data)
    values["name"] = name
    values["kinds"] = tuple(data.get("kinds", ()))
    values["workers"] = tuple(
        WorkerView(**_known(WorkerView, {"pool": name, **w})) for w in data.get("workers", ())
    )
    values["duration"] = _histogram(data.get("duration"), DURATION_BUCKETS)
    values["peak_rss"] = _histogram(data.get("peak_rss"), RSS_BUCKETS)
    return PoolView(**values)
