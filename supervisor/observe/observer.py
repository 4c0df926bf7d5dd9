"""``Observer``: builds the ``FleetSnapshot`` once per publish tick from the live objects.

It is the one piece of observe/ that touches the supervisor's state, and it only reads it:
pools and their worker handles, the counters, the drain phase, the pinger, the scaler's
figures. The queue figures (backlog, oldest age, jobs enqueued) come from the store, read at
most once a tick and never while the dispatcher is backing off from a failed store call; the
last figures are kept with their age when a read fails.

Typed loosely (``Any``) on purpose: observe/ sits below run/ and does not import it. Owned by
the supervisor's main thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from supervisor.errors import StoreError
from supervisor.model import PoolStats
from supervisor.observe.recorder import Series
from supervisor.observe.snapshot import RECENT_WINDOW, FleetSnapshot, PoolView, WorkerView

if TYPE_CHECKING:
    from supervisor.store import Store

log = logging.getLogger("fleetd.observe")

RATE_WINDOW = 60.0  # arrival rate and throughput: per second over the last minute
STARTING_GRACE = 30.0  # see health: a worker that never said Ready in this long is stuck


def progress_window(config: Any) -> float:
    """How long a pool with ready work may go without finishing a job before health calls it
    stalled: one whole job (timeout and its soft window) plus claim and heartbeat slack."""
    return config.timeout + config.soft_timeout + max(10.0, 2 * config.heartbeat)


def ping_timeout(config: Any) -> float:
    """How long an idle worker may take to answer a Ping before it counts as wedged."""
    return max(2.0, config.heartbeat)


@dataclass(frozen=True, slots=True)
class ObserverRead:
    """The observer's request to the store process (supervisor/run/requests.py holds the
    others; this one lives here, as observe/ never imports run/): per-pool stats and the
    enqueues since ``after_id``."""

    pools: Sequence[str]
    after_id: int | None

    def run(self, store: Store) -> tuple[dict[str, PoolStats], tuple[dict[str, int], int]]:
        return store.stats(self.pools), store.arrivals(after_id=self.after_id)

    def __reduce__(self) -> tuple[Any, ...]:  # as a call with its fields (requests.py)
        return (ObserverRead, (self.pools, self.after_id))


class Submits(Protocol):
    """What the observer needs of a link (supervisor/run/link.py's ``Link``)."""

    def submit(self, request: Any, on_reply: Callable[[Any], None]) -> None: ...


class Observer:
    def __init__(self, config: Any, *, node_id: str, hostname: str, pid: int, clock: Any) -> None:
        self.config = config
        self.node_id, self.hostname, self.pid = node_id, hostname, pid
        self.clock = clock
        self.started_at = clock.now()
        self.started_mono = clock.monotonic()
        self.series = Series(keep=RECENT_WINDOW + 2 * RATE_WINDOW)
        self.series.add(self.started_mono, {})  # every counter is 0 at boot
        self.stats: dict[str, PoolStats] = {}
        self.stats_read_at: float | None = None  # monotonic
        self.enqueued: dict[str, int] = {name: 0 for name in config.pools}
        self.last_id: int | None = None
        self.ready_since: dict[str, float] = {}
        self.latest: FleetSnapshot | None = None
        self.latest_at = 0.0  # monotonic
        self.reading = False  # a figures request is in flight

    # ---- the store's figures -----------------------------------------------------------

    def request(self, link: Submits, now: float) -> None:
        """Ask the store process for the figures (one request in flight at a time); they
        are applied when it answers."""
        if self.reading:
            return
        self.reading = True
        pools = list(self.config.pools)
        link.submit(ObserverRead(pools, self.last_id), on_reply=lambda r: self._figures(r, now))

    def _figures(self, reply: Any, asked: float) -> None:
        self.reading = False
        if reply.error is not None:
            log.debug("queue figures not read: %s", reply.error)
            return
        stats, (counts, last_id) = reply.value
        self._apply(stats, counts, last_id, asked)

    def read_store(self, store: Any, now: float) -> bool:
        """Read backlog, oldest age and new enqueues; False (figures kept) when it failed."""
        try:
            stats = store.stats(list(self.config.pools))
            counts, last_id = store.arrivals(after_id=self.last_id)
        except StoreError as exc:
            log.debug("queue figures not read: %s", exc)
            return False
        self._apply(stats, counts, last_id, now)
        return True

    def _apply(self, stats: Any, counts: dict[str, int], last_id: int, now: float) -> None:
        self.stats, self.stats_read_at = stats, now
        if self.last_id is not None:
            for pool, n in counts.items():
                if pool in self.enqueued:
                    self.enqueued[pool] += n
        self.last_id = last_id

    # ---- the snapshot ------------------------------------------------------------------

    def build(
        self,
        now: float,
        *,
        pools: Mapping[str, Any],
        counters: Any,
        draining: bool,
        dispatcher: Any,
        pinger: Any,
        scaling: Mapping[str, Any] | None = None,
        store_waiting_since: float | None = None,
        schedules: Mapping[str, Any] | None = None,
    ) -> FleetSnapshot:
        """The snapshot of this instant; also kept as ``latest``."""
        self._sample(now, counters)
        views = {
            name: self._pool(name, pool, now, counters, pinger, (scaling or {}).get(name))
            for name, pool in pools.items()
        }
        snap = FleetSnapshot(
            node_id=self.node_id,
            hostname=self.hostname,
            pid=self.pid,
            fleet=self.config.name,
            state="draining" if draining else "running",
            taken_at=self.started_at + (now - self.started_mono),
            started_at=self.started_at,
            store_ok=dispatcher.store_failures == 0,
            store_failures=dispatcher.store_failures,
            store_wait=(
                None if store_waiting_since is None else max(0.0, now - store_waiting_since)
            ),
            figures_age=None if self.stats_read_at is None else now - self.stats_read_at,
            pending_writes=dispatcher.pending_writes,
            lease_expiries=counters.lease_expiries,
            releases=counters.releases,
            lost_leases=counters.lost_leases,
            store_errors=counters.store_errors,
            boot_failures=counters.worker_boot_failures,
            recent_lease_expiries=int(self.series.delta("lease_expiries", now, RECENT_WINDOW)),
            pools=views,
            schedules=dict(schedules or {}),
        )
        self.latest, self.latest_at = snap, now
        return snap

    def current(self, now: float) -> tuple[FleetSnapshot | None, float]:
        """The latest snapshot and its age in seconds (what /metrics and /healthz serve)."""
        return self.latest, (now - self.latest_at if self.latest is not None else 0.0)

    def _sample(self, now: float, counters: Any) -> None:
        values: dict[str, float] = {"lease_expiries": counters.lease_expiries}
        for name in self.config.pools:
            finished = sum(v for (p, _), v in counters.finished.items() if p == name)
            failed = sum(v for (p, o), v in counters.finished.items() if p == name and o != "done")
            values[f"{name}:finished"] = finished
            values[f"{name}:failures"] = failed
            values[f"{name}:redeliveries"] = counters.redeliveries[name]
            values[f"{name}:dead_letters"] = sum(
                v for (p, _), v in counters.dead_letters.items() if p == name
            )
            values[f"{name}:kills"] = sum(
                v for (p, _), v in counters.worker_kills.items() if p == name
            )
            values[f"{name}:enqueued"] = self.enqueued.get(name, 0)
        self.series.add(now, values)

    def _pool(
        self, name: str, pool: Any, now: float, counters: Any, pinger: Any, scaling: Any
    ) -> PoolView:
        c = pool.config
        stats = self.stats.get(name)
        jobs = counters.jobs.pool(name)
        p50, p95, rss95 = counters.jobs.quantiles(name, now, RECENT_WINDOW)
        workers = tuple(self._worker(w, c, now, pinger) for w in pool.workers.values())
        desired, ceiling, binding, saturated = _sizing(pool, scaling, stats, workers)
        series = self.series
        return PoolView(
            name=name,
            kinds=tuple(c.handlers),
            bound=c.bound,
            slots=c.slots,
            workers=workers,
            target=pool.target,
            desired=desired,
            ceiling=ceiling,
            binding=binding,
            saturated=saturated,
            min_workers=c.min_workers,
            max_workers=c.max_workers,
            timeout=c.timeout,
            soft_timeout=c.soft_timeout,
            memory_limit=c.memory_limit,
            latency_target=c.latency_target,
            ping_timeout=ping_timeout(c),
            progress_window=progress_window(c),
            ready=stats.ready if stats else None,
            scheduled=stats.scheduled if stats else None,
            leased=stats.leased if stats else None,
            dead=stats.dead if stats else None,
            cancelled=stats.cancelled if stats else None,
            paused=bool(getattr(pool, "paused", False)),
            paused_kinds=tuple(sorted(getattr(pool, "paused_kinds", ()))),
            rate_limit=c.rate_limit,
            kind_rate_limit=dict(c.kind_rate_limit),
            # a paused pool claims nothing: its last claim's "held" is stale, the pause holds it
            rate_held=bool(
                getattr(pool, "rate_held", False)
                and not getattr(pool, "paused", False)
                and stats
                and stats.ready
            ),
            oldest_age=stats.oldest_ready_age if stats else 0.0,
            counts_capped=bool(stats and stats.capped),
            arrival_rate=series.rate(f"{name}:enqueued", now, RATE_WINDOW),
            throughput=series.rate(f"{name}:finished", now, RATE_WINDOW),
            duration_p50=p50,
            duration_p95=p95,
            peak_rss_p95=rss95,
            shared_baseline=getattr(pool, "shared_baseline", None),
            private_at_rest=getattr(pool, "private_at_rest", None),
            stalled_for=self._stalled_for(name, stats, jobs.last_finished, now),
            recent={
                key: int(series.delta(f"{name}:{key}", now, RECENT_WINDOW))
                for key in ("redeliveries", "failures", "dead_letters", "kills")
            },
            enqueued=self.enqueued.get(name, 0),
            redeliveries=counters.redeliveries[name],
            finished={o: v for (p, o), v in counters.finished.items() if p == name},
            dead_letters={k: v for (p, k), v in counters.dead_letters.items() if p == name},
            kills={r: v for (p, r), v in counters.worker_kills.items() if p == name},
            duration=jobs.duration.freeze(),
            peak_rss=jobs.peak_rss.freeze(),
        )

    def _stalled_for(
        self, name: str, stats: PoolStats | None, last_finished: float | None, now: float
    ) -> float | None:
        """Seconds the pool has had ready work while nothing finished here, capped by the
        oldest ready job's age (a queue that moves elsewhere is not stalled); None without
        ready work."""
        if stats is None or stats.ready == 0:
            self.ready_since.pop(name, None)
            return None
        since = self.ready_since.setdefault(name, now)
        progress = max(since, last_finished or since, self.started_mono)
        return max(0.0, min(now - progress, stats.oldest_ready_age))

    def _worker(self, w: Any, config: Any, now: float, pinger: Any) -> WorkerView:
        job = w.job
        rss = w.last_rss
        if w.state == "busy":  # one /proc read per busy worker per tick (~7 µs)
            rss = w.rss() or rss
        return WorkerView(
            pool=w.pool,
            slot=w.slot,
            pid=w.pid,
            state=w.state,
            job=job.claimed.job_id if job else None,
            kind=job.claimed.kind if job else None,
            attempt=job.claimed.attempt if job else None,
            elapsed=now - job.started if job else None,
            tenant=job.claimed.tenant if job else None,
            timeout=config.timeout,
            rss=rss,
            age=now - w.spawned_at,
            jobs_done=w.jobs_done,
            kill=w.kill_reason.kind if w.kill_reason else None,
            killed_for=now - w.killed_at if w.killed_at is not None else None,
            ping_wait=pinger.waiting(w.pid, now),
            running=len(w.running),
            slots=w.slots,
        )


def _sizing(
    pool: Any, scaling: Any, stats: PoolStats | None, workers: tuple[WorkerView, ...]
) -> tuple[int, int, str, bool]:
    """(desired, ceiling, binding constraint, saturated): the scaler's when it has decided,
    else the pool's target against max_workers."""
    ceiling = getattr(scaling, "ceiling", None)
    if scaling is not None and ceiling is not None:
        return scaling.desired, ceiling.value, ceiling.binding, bool(scaling.saturated)
    # No scaler figures yet (first ticks, or a build without the scaler): desired = target.
    c = pool.config
    ready = stats.ready if stats else 0
    busy = sum(1 for w in workers if w.state == "busy")
    saturated = (
        ready > 0
        and busy >= c.max_workers
        and (stats is not None and stats.oldest_ready_age > c.latency_target)
    )
    return pool.target, c.max_workers, "max_workers", saturated
