"""Prometheus metrics, rendered from the latest ``FleetSnapshot``; every metric is defined in
``METRICS`` below and nowhere else.

The registry is fleetd's own ``CollectorRegistry`` holding one collector that reads the
snapshot at scrape time (no process or platform collectors, no global state). Nothing is
updated event by event: counters and histograms are cumulative figures the snapshot carries.

Which numbers are fleet-wide: backlog, oldest age and jobs enqueued are read from the store,
so every node of a pool reports the same value (aggregate them with ``max``); every other
figure is this supervisor's own (aggregate with ``sum``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from supervisor.model import ErrorKind
from supervisor.observe.health import judge
from supervisor.observe.snapshot import FleetSnapshot, HistogramData, PoolView

OUTCOMES = ("done", "cancelled", *(str(k) for k in ErrorKind))
KILL_REASONS = ("memory_limit", "timeout", "lease_lost", "drain", "retire", "wedged", "cancel")
WORKER_STATES = ("busy", "idle", "starting", "stopping")

Samples = list[tuple[tuple[str, ...], float]]


@dataclass(frozen=True)
class MetricDef:
    name: str  # as exported (counters with their _total)
    kind: str  # gauge, counter, histogram
    help: str
    labels: tuple[str, ...] = ()


METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "fleetd_oldest_job_age_seconds",
        "gauge",
        "Age of the oldest ready job (fleet-wide, from the store)",
        ("pool",),
    ),
    MetricDef(
        "fleetd_backlog_jobs",
        "gauge",
        "Jobs ready to run now, not yet claimed (fleet-wide, from the store)",
        ("pool",),
    ),
    MetricDef(
        "fleetd_scheduled_jobs",
        "gauge",
        "Queued jobs not yet due: delayed or in retry backoff (fleet-wide)",
        ("pool",),
    ),
    MetricDef(
        "fleetd_jobs_enqueued_total",
        "counter",
        "Jobs enqueued since this supervisor started (fleet-wide, from the store)",
        ("pool",),
    ),
    MetricDef(
        "fleetd_jobs_finished_total",
        "counter",
        "Job deliveries finished here, by outcome (done or the error kind)",
        ("pool", "outcome"),
    ),
    MetricDef(
        "fleetd_job_duration_seconds",
        "histogram",
        "Run time of deliveries finished here, any outcome",
        ("pool",),
    ),
    MetricDef(
        "fleetd_job_peak_rss_bytes",
        "histogram",
        "Peak resident memory of deliveries finished here",
        ("pool",),
    ),
    MetricDef(
        "fleetd_lease_expiries_total",
        "counter",
        "Expired leases this supervisor's reaper returned to the queue or dead-lettered",
    ),
    MetricDef(
        "fleetd_redeliveries_total",
        "counter",
        "Jobs claimed here on a second or later delivery",
        ("pool",),
    ),
    MetricDef(
        "fleetd_lease_releases_total",
        "counter",
        "Leases handed back without counting the delivery (drain, unstarted jobs)",
    ),
    MetricDef(
        "fleetd_lost_leases_total",
        "counter",
        "Results or extensions refused because the lease was no longer ours",
    ),
    MetricDef("fleetd_workers", "gauge", "Worker processes here, by state", ("pool", "state")),
    MetricDef("fleetd_target_workers", "gauge", "Workers this pool is forking towards", ("pool",)),
    MetricDef(
        "fleetd_jobs_running",
        "gauge",
        "Jobs running here: one per busy slot (a worker of one slot runs one)",
        ("pool",),
    ),
    MetricDef(
        "fleetd_desired_workers",
        "gauge",
        "Workers the pool wants here before the ceiling (Little's law)",
        ("pool",),
    ),
    MetricDef("fleetd_pool_ceiling", "gauge", "Most workers the pool may have here", ("pool",)),
    MetricDef(
        "fleetd_pool_ceiling_binding",
        "gauge",
        "1 for the constraint that sets the ceiling",
        ("pool", "constraint"),
    ),
    MetricDef(
        "fleetd_pool_saturated",
        "gauge",
        "1 when at the ceiling and behind the latency target (alert, no more load)",
        ("pool",),
    ),
    MetricDef(
        "fleetd_latency_target_seconds", "gauge", "The pool's oldest-job age objective", ("pool",)
    ),
    MetricDef(
        "fleetd_dead_letters_total",
        "counter",
        "Jobs dead-lettered here, by error kind",
        ("pool", "error_kind"),
    ),
    MetricDef(
        "fleetd_worker_kills_total",
        "counter",
        "Workers the supervisor killed, by reason",
        ("pool", "reason"),
    ),
    MetricDef(
        "fleetd_worker_boot_failures_total", "counter", "Workers that died before they were ready"
    ),
    MetricDef("fleetd_store_errors_total", "counter", "Store calls that failed"),
    MetricDef("fleetd_store_up", "gauge", "1 when the last store call succeeded"),
    MetricDef(
        "fleetd_store_wait_seconds",
        "gauge",
        "Seconds the oldest unanswered store call has waited (0: none waits)",
    ),
    MetricDef(
        "fleetd_schedule_last_success_timestamp_seconds",
        "gauge",
        "When a job of the schedule last finished done, Unix seconds (fleet-wide, from the store)",
        ("schedule",),
    ),
    MetricDef(
        "fleetd_schedule_ticks_total",
        "counter",
        "Ticks this supervisor decided, by outcome: on_time, late (enqueued by catch-up), "
        "missed (not enqueued: catch_up), skipped (not enqueued: overlap)",
        ("schedule", "outcome"),
    ),
    MetricDef(
        "fleetd_schedule_late_seconds",
        "gauge",
        "Seconds a due tick has waited past its grace without being decided (0: none)",
        ("schedule",),
    ),
    MetricDef(
        "fleetd_pool_paused",
        "gauge",
        "1 while the pool (kind empty) or one kind of it is paused fleet-wide",
        ("pool", "kind"),
    ),
    MetricDef(
        "fleetd_pool_rate_limit",
        "gauge",
        "The pool's rate_limit (kind empty) or a kind's kind_rate_limit, jobs per second, "
        "fleet-wide",
        ("pool", "kind"),
    ),
    MetricDef(
        "fleetd_pool_rate_held",
        "gauge",
        "1 while this node's last claim left ready jobs queued for want of a rate-limit token",
        ("pool",),
    ),
    MetricDef(
        "fleetd_cancelled_jobs",
        "gauge",
        "Cancelled jobs in the queue's table (kept until the retention), fleet-wide",
        ("pool",),
    ),
    MetricDef("fleetd_draining", "gauge", "1 while the supervisor drains"),
    MetricDef("fleetd_healthy", "gauge", "1 when /healthz answers 200"),
    MetricDef("fleetd_uptime_seconds", "gauge", "Seconds since the supervisor started"),
)

NAMES = frozenset(m.name for m in METRICS)


def _per_pool(value: Callable[[PoolView], float | None]) -> Callable[[FleetSnapshot], Samples]:
    def samples(snap: FleetSnapshot) -> Samples:
        out = [((p.name,), value(p)) for p in snap.pools.values()]
        return [(labels, float(v)) for labels, v in out if v is not None]

    return samples


def _per_pool_key(
    table: Callable[[PoolView], dict[str, int]], keys: tuple[str, ...]
) -> Callable[[FleetSnapshot], Samples]:
    """Every known key is exported (0 until it happens), so rate() works from the start."""

    def samples(snap: FleetSnapshot) -> Samples:
        out: Samples = []
        for p in snap.pools.values():
            values = table(p)
            for key in dict.fromkeys((*keys, *values)):
                out.append(((p.name, key), float(values.get(key, 0))))
        return out

    return samples


SCHEDULE_OUTCOMES = ("on_time", "late", "missed", "skipped")


def _last_success(snap: FleetSnapshot) -> Samples:
    return [
        ((s.name,), float(s.last_success_at))
        for s in snap.schedules.values()
        if s.last_success_at is not None
    ]


def _schedule_ticks(snap: FleetSnapshot) -> Samples:
    return [
        ((s.name, outcome), float(s.ticks.get(outcome, 0)))
        for s in snap.schedules.values()
        for outcome in SCHEDULE_OUTCOMES
    ]


def _paused(snap: FleetSnapshot) -> Samples:
    """``{pool, kind=""}`` 1 when the whole pool is paused, else 0 (every pool has the
    series, so an alert can use it at once); one ``{pool, kind}`` series of 1 per kind
    paused on its own."""
    out: Samples = []
    for p in snap.pools.values():
        out.append(((p.name, ""), 1.0 if p.paused else 0.0))
        if not p.paused:
            out.extend(((p.name, kind), 1.0) for kind in p.paused_kinds)
    return out


def _rate_limits(snap: FleetSnapshot) -> Samples:
    """One series per limit: ``{pool, kind=""}`` for the pool's, ``{pool, kind}`` per kind."""
    out: Samples = []
    for p in snap.pools.values():
        if p.rate_limit is not None:
            out.append(((p.name, ""), p.rate_limit))
        out.extend(((p.name, kind), r) for kind, r in sorted(p.kind_rate_limit.items()))
    return out


def _node(value: Callable[[FleetSnapshot], float]) -> Callable[[FleetSnapshot], Samples]:
    return lambda snap: [((), float(value(snap)))]


def _binding(snap: FleetSnapshot) -> Samples:
    constraints = ("max_workers", "cpu", "memory", "max_inflight", "rate")
    return [
        ((p.name, c), 1.0 if p.binding == c else 0.0)
        for p in snap.pools.values()
        for c in dict.fromkeys((*constraints, p.binding))
    ]


def _workers(snap: FleetSnapshot) -> Samples:
    return [((p.name, s), float(p.count(s))) for p in snap.pools.values() for s in WORKER_STATES]


SAMPLES: dict[str, Callable[[FleetSnapshot], Samples]] = {
    "fleetd_oldest_job_age_seconds": _per_pool(lambda p: p.oldest_age),
    "fleetd_backlog_jobs": _per_pool(lambda p: p.ready),
    "fleetd_scheduled_jobs": _per_pool(lambda p: p.scheduled),
    "fleetd_jobs_enqueued_total": _per_pool(lambda p: p.enqueued),
    "fleetd_jobs_finished_total": _per_pool_key(lambda p: p.finished, OUTCOMES),
    "fleetd_lease_expiries_total": _node(lambda s: s.lease_expiries),
    "fleetd_redeliveries_total": _per_pool(lambda p: p.redeliveries),
    "fleetd_lease_releases_total": _node(lambda s: s.releases),
    "fleetd_lost_leases_total": _node(lambda s: s.lost_leases),
    "fleetd_workers": _workers,
    "fleetd_target_workers": _per_pool(lambda p: p.target),
    "fleetd_jobs_running": _per_pool(lambda p: p.running),
    "fleetd_desired_workers": _per_pool(lambda p: p.desired),
    "fleetd_pool_ceiling": _per_pool(lambda p: p.ceiling),
    "fleetd_pool_ceiling_binding": _binding,
    "fleetd_pool_saturated": _per_pool(lambda p: 1.0 if p.saturated else 0.0),
    "fleetd_latency_target_seconds": _per_pool(lambda p: p.latency_target),
    "fleetd_dead_letters_total": _per_pool_key(
        lambda p: p.dead_letters, tuple(str(k) for k in ErrorKind)
    ),
    "fleetd_worker_kills_total": _per_pool_key(lambda p: p.kills, KILL_REASONS),
    "fleetd_worker_boot_failures_total": _node(lambda s: s.boot_failures),
    "fleetd_store_errors_total": _node(lambda s: s.store_errors),
    "fleetd_store_up": _node(lambda s: 1.0 if s.store_ok else 0.0),
    "fleetd_store_wait_seconds": _node(lambda s: s.store_wait or 0.0),
    "fleetd_schedule_last_success_timestamp_seconds": _last_success,
    "fleetd_schedule_ticks_total": _schedule_ticks,
    "fleetd_schedule_late_seconds": lambda snap: [
        ((s.name,), s.late_for) for s in snap.schedules.values()
    ],
    "fleetd_pool_paused": lambda snap: _paused(snap),
    "fleetd_pool_rate_limit": _rate_limits,
    "fleetd_pool_rate_held": _per_pool(lambda p: 1.0 if p.rate_held else 0.0),
    "fleetd_cancelled_jobs": _per_pool(lambda p: p.cancelled),
    "fleetd_draining": _node(lambda s: 1.0 if s.state == "draining" else 0.0),
    "fleetd_healthy": _node(lambda s: 1.0 if judge(s).healthy else 0.0),
    "fleetd_uptime_seconds": _node(lambda s: s.uptime),
}

HISTOGRAMS: dict[str, Callable[[PoolView], HistogramData]] = {
    "fleetd_job_duration_seconds": lambda p: p.duration,
    "fleetd_job_peak_rss_bytes": lambda p: p.peak_rss,
}


class SnapshotCollector:
    """Yields every metric of ``METRICS`` from ``source()`` (the latest snapshot)."""

    def __init__(self, source: Callable[[], FleetSnapshot | None]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        snap = self.source()
        if snap is None:
            return
        for m in METRICS:
            yield self._family(m, snap)

    def _family(self, m: MetricDef, snap: FleetSnapshot) -> Metric:
        if m.kind == "histogram":
            hist = HistogramMetricFamily(m.name, m.help, labels=m.labels)
            for p in snap.pools.values():
                data = HISTOGRAMS[m.name](p)
                hist.add_metric([p.name], data.cumulative(), data.total)
            return hist
        cls = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
        family = cls(m.name, m.help, labels=m.labels)
        for labels, value in SAMPLES[m.name](snap):
            family.add_metric(list(labels), value)
        return family


def make_registry(source: Callable[[], FleetSnapshot | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(source))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format (``CONTENT_TYPE_LATEST``)."""
    return generate_latest(registry)
