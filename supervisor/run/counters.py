"""What happened since this supervisor started: plain counters owned by the main thread, read
by the snapshot (status, metrics) and logged at exit."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from supervisor.observe.recorder import JobRecorder


@dataclass
class Counters:
    finished: Counter[tuple[str, str]] = field(default_factory=Counter)  # (pool, outcome)
    dead_letters: Counter[tuple[str, str]] = field(default_factory=Counter)  # (pool, kind)
    worker_kills: Counter[tuple[str, str]] = field(default_factory=Counter)  # (pool, reason)
    claimed: Counter[str] = field(default_factory=Counter)  # pool
    redeliveries: Counter[str] = field(default_factory=Counter)  # claims with attempt > 1
    releases: int = 0
    lease_expiries: int = 0  # jobs this node's reaper found with an expired lease
    lost_leases: int = 0  # acks, fails or extensions whose lease was no longer ours
    store_errors: int = 0  # store calls that failed (database unreachable)
    worker_boot_failures: int = 0
    jobs: JobRecorder = field(default_factory=JobRecorder)  # durations and peaks (histograms)

    def job_finished(
        self, pool: str, outcome: str, duration: float | None, peak_rss: int | None, at: float
    ) -> None:
        """One delivery ended here: ``outcome`` is "done" or the error kind."""
        self.finished[(pool, outcome)] += 1
        self.jobs.record(pool, duration, peak_rss, at)
