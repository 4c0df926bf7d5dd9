"""``Scaler``: every ``scale_interval`` each pool's target worker count is re-decided from
measured figures, and the pool's ceiling recomputed.

    store.stats (backlog, oldest age) ─┐
    store.history (done in the window: ├─> arrival rate, service time, peak per job
      count, durations, peaks)        ─┘            │
    host facts (cores, memory budget), live nodes ──┴─> policy.ceilings / desired_slots /
                                                        host_share / next_target ─> pool.target

The arrival rate is measured, not assumed: completions per second over the window plus the
backlog's growth per second since the last evaluation (what arrived either finished or is
still waiting). Until the pool has finished a job there is no service time: the scaler then
adds one worker at a time while work is waiting. All decisions are in ``supervisor.policy``;
this module gathers the figures (one request to the store process, ``ScalerRead``; the
evaluation runs when it answers) and applies the result. Owned by the main thread.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from supervisor.model import PoolHistory, PoolStats
from supervisor.policy import (
    Ceiling,
    PoolSizing,
    ScaleState,
    ceilings,
    desired_slots,
    desired_workers,
    host_share,
    next_target,
    saturated,
)
from supervisor.run.link import Link, Reply
from supervisor.run.pool import Pool
from supervisor.run.requests import ScalerRead

log = logging.getLogger("fleetd.scaler")

WINDOW_EVALUATIONS = 30  # rates are measured over this many scale intervals (60 s at 2 s),
WINDOW_BOUNDS = (10.0, 300.0)  # within these bounds
NODE_FRESH = 10.0  # a node whose heartbeat is older than this is not counted as live


@dataclass
class PoolScaling:
    """What the scaler measured and decided for one pool (read by the snapshot)."""

    state: ScaleState = field(default_factory=ScaleState)
    ceiling: Ceiling | None = None
    desired: int = 0
    arrival_rate: float = 0.0
    throughput: float = 0.0
    service_time: float | None = None
    backlog: int = 0
    oldest_age: float = 0.0
    saturated: bool = False
    backlog_samples: deque[tuple[float, int]] = field(default_factory=deque)  # (time, ready)
    scale_events: int = 0


class Scaler:
    def __init__(
        self,
        link: Link,
        pools: Mapping[str, Pool],
        *,
        cores: int,
        memory_budget: int,
        interval: float,
        started: float,
    ) -> None:
        self.link = link  # to the store process (supervisor/run/storelink.py)
        self.pools = pools
        self.reading = False
        self.frozen = False  # a drain began: no more decisions, even from a late reply
        self.cores = cores
        self.memory_budget = memory_budget
        self.interval = interval
        low, high = WINDOW_BOUNDS
        self.window = min(high, max(low, WINDOW_EVALUATIONS * interval))
        self.started = started
        self.next_eval = started
        self.scaling = {name: PoolScaling() for name in pools}
        self.live_nodes = 1

    def tick(self, now: float, *, draining: bool) -> None:
        """Re-decide every pool's target when an evaluation is due."""
        if draining or self.reading or now < self.next_eval:
            return
        self.next_eval = now + self.interval
        self.reading = True
        self.link.submit(
            ScalerRead(list(self.pools), self.window),
            on_reply=lambda reply: self._evaluate(reply, now),
        )

    def _evaluate(self, reply: Reply, now: float) -> None:
        self.reading = False
        if self.frozen:
            return
        if reply.error is not None:
            log.debug("scaling skipped: %s", reply.error)
            return
        stats, history, nodes = reply.value
        self.live_nodes = max(1, sum(1 for n in nodes if _live(n)))
        for pool in self.pools.values():
            pool.measure_memory()  # the shared baseline the ceiling counts once
        limits = ceilings(
            [self._sizing(p, history[n]) for n, p in self.pools.items()],
            self.cores,
            self.memory_budget,
        )
        for name, pool in self.pools.items():
            self._decide(pool, stats[name], history[name], limits[name], now)

    def _sizing(self, pool: Pool, history: PoolHistory) -> PoolSizing:
        c = pool.config
        return PoolSizing(
            c.name,
            c.bound,
            c.min_workers,
            c.max_workers,
            c.job_memory,
            history.peaks,
            c.max_inflight,
            pool.shared_baseline or 0,
            slots=c.slots,
            rate_limit=c.rate_limit,
            service_time=statistics.fmean(history.durations) if history.durations else None,
            utilization=c.utilization,
            nodes=self.live_nodes,
        )

    def _decide(
        self, pool: Pool, stats: PoolStats, history: PoolHistory, ceiling: Ceiling, now: float
    ) -> None:
        s = self.scaling[pool.name]
        c = pool.config
        self._measure(s, stats, history, now)
        if s.service_time is None:  # nothing finished yet: probe, one worker at a time
            desired_total = pool.target + 1 if stats.ready else c.min_workers
        else:
            desired_total = desired_slots(
                s.arrival_rate,
                s.service_time,
                stats.ready,
                c.latency_target,
                c.utilization,
                stats.oldest_ready_age,
            )
            # Little's law gives slots (jobs at once); a worker runs ``slots`` of them
            desired_total = desired_workers(desired_total, c.slots)
        s.desired = host_share(desired_total, self.live_nodes)
        if pool.paused:  # its backlog waits on purpose: it runs nothing, as an idle pool
            s.desired = 0  # (down to min_workers, one a cooldown at a time)
        s.ceiling = ceiling
        pool.ceiling = ceiling.value  # a spare worker must fit under it too
        target, s.state = next_target(
            pool.target, s.desired, ceiling.value, c.min_workers, s.state, now, c.scale_in_cooldown
        )
        if target != pool.target:
            s.scale_events += 1
            log.info(
                "pool %s: %d -> %d workers (desired %d, ceiling %d by %s, backlog %d, "
                "oldest %.1fs)",
                pool.name,
                pool.target,
                target,
                s.desired,
                ceiling.value,
                ceiling.binding,
                stats.ready,
                stats.oldest_ready_age,
            )
            pool.target = target
        self._saturation(pool, s, ceiling)

    def _measure(self, s: PoolScaling, stats: PoolStats, history: PoolHistory, now: float) -> None:
        """Arrivals over the window = completions + growth of the backlog, both measured over
        the same window, so one noisy interval does not swing the decision."""
        span = max(1.0, min(self.window, now - self.started))
        s.throughput = history.completed / span
        samples = s.backlog_samples
        samples.append((now, stats.ready))
        while len(samples) > 1 and now - samples[0][0] > self.window:
            samples.popleft()
        growth = 0.0
        if len(samples) > 1 and now > samples[0][0]:
            growth = (stats.ready - samples[0][1]) / (now - samples[0][0])
        s.arrival_rate = max(0.0, s.throughput + growth)
        s.service_time = statistics.fmean(history.durations) if history.durations else None
        s.backlog, s.oldest_age = stats.ready, stats.oldest_ready_age

    def _saturation(self, pool: Pool, s: PoolScaling, ceiling: Ceiling) -> None:
        # a paused pool's backlog waits on purpose: that is not a want of capacity
        now_saturated = not pool.paused and saturated(
            pool.target, ceiling.value, s.oldest_age, pool.config.latency_target
        )
        if now_saturated != s.saturated:
            s.saturated = now_saturated
            if now_saturated:
                log.warning(
                    "pool %s saturated: at its ceiling of %d (%s) and the oldest job "
                    "has waited %.0fs (latency target %.0fs); not adding load",
                    pool.name,
                    ceiling.value,
                    ceiling.binding,
                    s.oldest_age,
                    pool.config.latency_target,
                )
            else:
                log.warning("pool %s no longer saturated", pool.name)

    def due_at(self) -> float | None:
        """The next evaluation, unless a read is in flight (its reply wakes the loop)."""
        return None if self.reading else self.next_eval


def _live(node: Mapping[str, object]) -> bool:
    age = node.get("age")
    return (
        node.get("state") in ("running", "draining")
        and isinstance(age, float | int)
        and (age < NODE_FRESH)
    )
