"""What the snapshot needs remembered between ticks: finished jobs (histograms since start and
a recent sample for quantiles), and cumulative counters sampled over time (rates and "in the
last five minutes" are differences of two samples). Pure: the caller passes every time.

Owned by the supervisor's main thread (``Counters`` holds the ``JobRecorder``; the
``Observer`` holds the ``Series``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from supervisor.observe.snapshot import DURATION_BUCKETS, RSS_BUCKETS, HistogramData

SAMPLE = 1000  # finished jobs kept per pool for quantiles (the most recent ones)


@dataclass
class Histogram:
    """A mutable cumulative histogram; ``freeze()`` gives the snapshot's value."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def freeze(self) -> HistogramData:
        return HistogramData(self.bounds, tuple(self.counts), self.total, self.count)


@dataclass
class PoolJobs:
    duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    peak_rss: Histogram = field(default_factory=lambda: Histogram(RSS_BUCKETS))
    recent: deque[tuple[float, float | None, int | None]] = field(
        default_factory=lambda: deque(maxlen=SAMPLE)
    )  # (monotonic time, duration, peak RSS)
    last_finished: float | None = None  # monotonic


class JobRecorder:
    """Every job this supervisor saw finish, whatever the outcome."""

    def __init__(self) -> None:
        self.pools: dict[str, PoolJobs] = {}

    def pool(self, name: str) -> PoolJobs:
        if name not in self.pools:
            self.pools[name] = PoolJobs()
        return self.pools[name]

    def record(self, pool: str, duration: float | None, peak_rss: int | None, at: float) -> None:
        p = self.pool(pool)
        if duration is not None:
            p.duration.observe(duration)
        if peak_rss is not None:
            p.peak_rss.observe(peak_rss)
        p.recent.append((at, duration, peak_rss))
        p.last_finished = at

    def quantiles(
        self, pool: str, now: float, window: float
    ) -> tuple[float | None, float | None, int | None]:
        """(p50 duration, p95 duration, p95 peak RSS) of jobs finished in the last ``window``."""
        recent = [r for r in self.pool(pool).recent if r[0] >= now - window]
        durations = [d for _, d, _ in recent if d is not None]
        peaks = [p for _, _, p in recent if p is not None]
        p95_rss = quantile(peaks, 0.95)
        return (
            quantile(durations, 0.5),
            quantile(durations, 0.95),
            int(p95_rss) if p95_rss is not None else None,
        )


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (a value that was observed), None for no values.

    >>> quantile([1, 2, 3, 4, 100], 0.95), quantile([1, 2, 3, 4], 0.5), quantile([], 0.5)
    (100, 2, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


class Series:
    """Samples of cumulative counters, so a rate or a "last N seconds" count is the difference
    between now and the sample taken about N seconds ago. Keeps ``keep`` seconds."""

    def __init__(self, keep: float) -> None:
        self.keep = keep
        self.samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, now: float, values: dict[str, float]) -> None:
        self.samples.append((now, dict(values)))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.keep:
            self.samples.popleft()

    def _base(self, now: float, window: float) -> tuple[float, dict[str, float]]:
        """The newest sample at least ``window`` seconds old (else the oldest one)."""
        base = self.samples[0]
        for sample in self.samples:
            if sample[0] > now - window:
                break
            base = sample
        return base

    def delta(self, key: str, now: float, window: float) -> float:
        """How much ``key`` grew over the last ``window`` seconds (or since the first sample)."""
        if not self.samples:
            return 0.0
        _, base = self._base(now, window)
        return max(0.0, self.samples[-1][1].get(key, 0.0) - base.get(key, 0.0))

    def rate(self, key: str, now: float, window: float) -> float:
        """Per second over the last ``window`` seconds (or the span the samples cover)."""
        if len(self.samples) < 2:
            return 0.0
        span = self.samples[-1][0] - self._base(now, window)[0]
        return self.delta(key, now, window) / span if span > 0 else 0.0
