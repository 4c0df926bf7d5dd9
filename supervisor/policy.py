"""Pure decisions: values in, values out. No I/O, no clock reads, no randomness of its own
(jitter comes in as ``rng``), so every rule here is tested with tables.

- ``retry_delay``: exponential backoff with full jitter, for a failed delivery.
- ``respawn_delay``: how long a pool waits before forking again after workers died at boot.
- ``poll_delay``: the adaptive poll interval of an idle pool.
- ``KillReason``: why the parent killed a worker (``supervisor.run.exits`` turns it and the
  exit status into the job's fate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Random(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def backoff_cap(attempt: int, base: float, cap: float) -> float:
    """The upper bound of the delay before retry number ``attempt`` (1 after the first
    failed delivery): base, 2 base, 4 base, ... never above cap.

    >>> [backoff_cap(a, 1.0, 10.0) for a in (1, 2, 3, 4, 5)]
    [1.0, 2.0, 4.0, 8.0, 10.0]
    """
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 s is already forever; avoid overflow
    return min(cap, base * (2.0**exponent))


def retry_delay(attempt: int, base: float, cap: float, rng: Random) -> float:
    """Full jitter: uniform between 0 and the backoff cap, so a crowd of jobs that failed
    together does not come back together."""
    return rng.uniform(0.0, backoff_cap(attempt, base, cap))


RESPAWN_BASE = 0.5
RESPAWN_MAX = 30.0


def respawn_delay(boot_failures: int) -> float:
    """Seconds to wait before the next fork after ``boot_failures`` workers in a row died
    before they were ready: 0 for none, then 0.5 s doubling to 30 s.

    >>> [respawn_delay(n) for n in (0, 1, 2, 3, 9)]
    [0.0, 0.5, 1.0, 2.0, 30.0]
    """
    if boot_failures <= 0:
        return 0.0
    return min(RESPAWN_MAX, RESPAWN_BASE * 2.0 ** min(boot_failures - 1, 30))


POLL_MIN = 0.05
POLL_MAX = 1.0


def poll_delay(empty_claims: int) -> float:
    """The wait before polling an idle pool again after ``empty_claims`` claims in a row came
    back short: 50 ms doubling to 1 s. Wake-ups (NOTIFY, local datagrams) cut it short.

    >>> [poll_delay(n) for n in (0, 1, 2, 5, 10)]
    [0.05, 0.1, 0.2, 1.0, 1.0]
    """
    return min(POLL_MAX, POLL_MIN * 2.0 ** min(empty_claims, 20))


PIPELINE_BUDGET = 0.004  # seconds of work a worker may hold queued behind its running job
JOB_OVERHEAD = 50e-6  # a worker's own time per job besides the handler (measured: ~40-60 µs)
FOLLOW = 0.05  # how far one job shorter than PIPELINE_BUDGET moves ``recent_duration``


def pipeline_depth(recent_duration: float | None, limit: int) -> int:
    """How many jobs one worker may hold at once: the running one and those queued behind it.

    Queueing saves the parent a round trip per job, which is most of the cost of a very short
    job; but a queued job waits for those ahead of it, and if one of them hangs, until its
    timeout. So only as many as ``recent_duration`` (the pool's recent handler time, rising at
    once on a slow job, falling slowly) say run in ``PIPELINE_BUDGET``: short jobs queue up
    to ``limit``, jobs of 4 ms or more (or not measured yet) never.

    >>> [pipeline_depth(d, 64) for d in (None, 0.0, 0.00005, 0.0005, 0.004, 1.0)]
    [1, 64, 40, 7, 1, 1]
    """
    if recent_duration is None or limit <= 1:
        return 1
    return max(1, min(limit, int(PIPELINE_BUDGET / (recent_duration + JOB_OVERHEAD))))


def recent_duration(previous: float | None, duration: float) -> float:
    """The estimate ``pipeline_depth`` reads. A job of ``PIPELINE_BUDGET`` or more (one that
    stops queueing by itself) sets it at once; a shorter one moves it ``FOLLOW`` of the way
    toward itself (so one slow job stops queueing for ~100 jobs, and a pool whose jobs
    became slower follows them within ~10).

    A short job that took longer than its neighbours (a network round trip of 2 ms among
    0.1 ms ones, a process descheduled on a loaded host) is jitter, not a sign that the next
    may hang: followed at once, it cut an INCR pool's depth from ~26 to ~4 several times a
    second, and its claims to a dozen jobs each.

    >>> recent_duration(None, 0.5), recent_duration(0.001, 0.5), recent_duration(0.5, 0.0)
    (0.5, 0.5, 0.475)
    >>> round(recent_duration(0.0001, 0.0021), 6)  # jitter: a twentieth of the way
    0.0002
    """
    if previous is None or duration >= max(previous, PIPELINE_BUDGET):
        return duration
    return previous + FOLLOW * (duration - previous)


class KillKind(StrEnum):
    """Why a worker is (to be) killed. The first three fail its job with that error kind;
    ``lease_lost`` forgets it (the lease is not ours); the rest release it untouched.
    ``soft_timeout`` and ``wait`` are watchdog verdicts that kill nothing yet."""

    MEMORY_LIMIT = "memory_limit"
    TIMEOUT = "timeout"
    WEDGED = "wedged"  # it stopped answering pings while idle (no job to fail)
    LEASE_LOST = "lease_lost"
    DRAIN = "drain"
    RETIRE = "retire"
    SOFT_TIMEOUT = "soft_timeout"
    WAIT = "wait"
    CANCEL = "cancel"  # an operator cancelled its job: the job ends cancelled (run/controls.py)


@dataclass(frozen=True, slots=True)
class KillReason:
    """Why the parent killed a worker; decides what happens to its job. ``job_id``: the job
    the kill is about, in a worker with slots (None: the job it runs, the oldest)."""

    kind: KillKind
    detail: str = ""
    job_id: int | None = None


# ---- sizing: the ceiling each pool may never pass --------------------------------------

MEASURED_PEAKS_NEEDED = 20  # measured jobs before their peaks replace the configured job_memory
PEAK_PERCENTILE = 0.99


@dataclass(frozen=True, slots=True)
class PoolSizing:
    """What sizing needs to know of one pool (config plus measurements)."""

    name: str
    bound: str  # "cpu" or "io"
    min_workers: int
    max_workers: int
    job_memory: int  # configured peak RSS of one job, bytes
    measured_peaks: tuple[int, ...] = ()  # recent jobs' peak RSS, bytes
    max_inflight: int | None = None
    # bytes of a worker's RSS that every worker of the pool shares (the pages inherited at
    # fork, measured: workers.tree.memory_split): counted once per pool, not per worker
    shared: int = 0
    slots: int = 1  # jobs one worker runs at once (workers/slots.py)
    # a rate limit's ceiling (``rate_ceiling``): jobs per second fleet-wide, the measured
    # mean service time (None: none yet), the planned utilization, the live nodes sharing it
    rate_limit: float | None = None
    service_time: float | None = None
    utilization: float = 0.7
    nodes: int = 1


@dataclass(frozen=True, slots=True)
class Ceiling:
    """A pool's ceiling on this host, every figure it came from, and which one binds."""

    pool: str
    value: int
    binding: str  # "max_workers", "cpu", "memory", "max_inflight" or "rate"
    max_workers: int
    cpu: int | None  # None for io-bound pools
    memory: int
    max_inflight: int | None
    peak_per_job: int
    peak_source: str  # "configured" (job_memory) or "measured" (p99 of recent peaks)
    memory_share: int  # bytes of the fleet's memory budget this pool may use
    shared: int = 0  # the pool's shared baseline, counted once in its share
    per_worker: int = 0  # what one more worker costs: peak per job less the shared baseline
    rate: int | None = None  # the workers a rate_limit keeps busy here (None: no figure)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank (no interpolation: a real observed value).

    >>> percentile([10, 20, 30, 40, 1000], 0.95)
    1000
    >>> percentile([5], 0.5)
    5
    """
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def peak_per_job(pool: PoolSizing) -> tuple[int, str]:
    """The peak RSS to plan one job at: a high percentile of measured peaks once there are
    enough of them (never the mean: one 900 MB document in a stream of 20 MB ones is what
    kills the box), else the configured job_memory."""
    if len(pool.measured_peaks) >= MEASURED_PEAKS_NEEDED:
        return int(percentile(pool.measured_peaks, PEAK_PERCENTILE)), "measured"
    # a worker with slots runs ``slots`` jobs at once: planned at that many jobs' peak until
    # measured (its jobs then report the worker's peak: memory is per worker)
    return pool.job_memory * pool.slots, "configured"


def ceilings(pools: Sequence[PoolSizing], cores: int, memory_budget: int) -> dict[str, Ceiling]:
    """Each pool's ceiling: min(max_workers, its share of the cores if cpu-bound, its share of
    the memory budget less its shared baseline divided by what one worker adds (peak per job
    less the shared baseline: ``worker_cost``), max_inflight). Cores are split among the
    cpu-bound pools, and the budget among all pools, in proportion to what each could use at
    its max_workers, so two pools never each count on the whole host."""
    peaks = {p.name: peak_per_job(p) for p in pools}
    costs = {p.name: worker_cost(peaks[p.name][0], p.shared) for p in pools}
    cpu_pools = [p for p in pools if p.bound == "cpu"]
    cpu_demand = sum(p.max_workers for p in cpu_pools) or 1
    mem_demand = sum(p.shared + p.max_workers * costs[p.name] for p in pools) or 1
    out: dict[str, Ceiling] = {}
    for p in pools:
        peak, source = peaks[p.name]
        cost = costs[p.name]
        cpu = max(1, cores * p.max_workers // cpu_demand) if p.bound == "cpu" else None
        share = memory_budget * (p.shared + p.max_workers * cost) // mem_demand
        memory = max(1, (share - p.shared) // cost)
        rate = rate_ceiling(p.rate_limit, p.service_time, p.utilization, p.nodes)
        figures = {
            "max_workers": p.max_workers,
            "cpu": cpu,
            "memory": memory,
            # a fleet-wide cap counts jobs; a worker with slots runs ``slots`` of them
            "max_inflight": desired_workers(p.max_inflight, p.slots) if p.max_inflight else None,
            "rate": desired_workers(rate, p.slots) if rate else None,
        }
        binding = min((v, k) for k, v in figures.items() if v is not None)[1]
        out[p.name] = Ceiling(
            p.name,
            figures[binding] or 1,
            binding,
            p.max_workers,
            cpu,
            memory,
            p.max_inflight,
            peak,
            source,
            share,
            p.shared,
            cost,
            rate,
        )
    return out


def rate_ceiling(
    rate: float | None, service_time: float | None, utilization: float, nodes: int
) -> int | None:
    """The jobs a downstream's rate limit keeps busy at once, this host's share (``ceilings``
    turns them into workers of ``slots`` each): Little's law,
    rate × service time / utilization (the seed: an API allowing 50 requests/s has a fixed
    concurrency ceiling whatever the backlog). More workers would only wait for tokens. None
    without a rate or before a service time is measured.

    >>> rate_ceiling(50.0, 0.2, 0.7, 1)   # 50/s × 200 ms / 0.7 = 14.3
    15
    >>> rate_ceiling(50.0, 0.2, 0.7, 2)   # two live nodes share it
    8
    >>> rate_ceiling(10.0, 0.001, 0.7, 1), rate_ceiling(50.0, None, 0.7, 1)
    (1, None)
    """
    if rate is None or service_time is None:
        return None
    return max(1, host_share(math.ceil(rate * service_time / utilization - 1e-9), nodes))


MIN_WORKER_COST = 1 << 20  # bytes: a worker never plans at less than this


def worker_cost(peak: int, shared: int) -> int:
    """What one more worker of a pool costs the host: its peak per job less the pages every
    worker shares (inherited at fork, resident once however many workers map them).

    >>> worker_cost(46 << 20, 40 << 20) >> 20   # 46 MiB RSS of which 40 shared: 6 MiB
    6
    >>> worker_cost(200 << 20, 0) >> 20         # nothing measured yet: the whole peak
    200
    """
    return max(peak - shared, MIN_WORKER_COST)


# ---- scaling: how many workers to want now ---------------------------------------------


def desired_slots(
    arrival_rate: float,
    service_time: float,
    backlog: int,
    latency_target: float,
    utilization: float = 0.7,
    oldest_age: float = 0.0,
) -> int:
    """Little's law on measured figures: the slots needed to keep up with arrivals and clear
    the backlog before its oldest job passes the latency target, planned at ``utilization``
    (never 100 %: queueing delay grows without bound as utilization approaches 1). The time
    left to clear is the target minus the oldest job's age (at least a tenth of the target):
    a backlog that has already waited most of its budget needs more hands than a fresh one.

    >>> desired_slots(12, 0.8, 9000, 300)  # the seed's example: 42 jobs/s x 0.8 s / 0.7
    48
    >>> desired_slots(0, 0.3, 2, 4.0, oldest_age=3.3)  # 2 jobs, 0.7 s left
    2
    """
    time_left = max(latency_target - oldest_age, latency_target / 10)
    required = arrival_rate + backlog / time_left
    slots = required * service_time / utilization
    return max(0, math.ceil(slots - 1e-9))  # 48.00000000000001 is 48 slots, not 49


def desired_workers(slots: int, slots_per_worker: int) -> int:
    """Workers to run ``slots`` jobs at once, ``slots_per_worker`` each (the seed's sizing).

    >>> desired_workers(48, 4)   # the seed's example: 48 slots, 4 per worker
    12
    >>> desired_workers(49, 20), desired_workers(0, 20), desired_workers(7, 1)
    (3, 0, 7)
    """
    return math.ceil(slots / max(1, slots_per_worker))


def host_share(desired_total: int, live_nodes: int) -> int:
    """This host's part of a fleet-wide desired count (every live node takes an equal share,
    rounded up so the fleet never falls short)."""
    return math.ceil(desired_total / max(1, live_nodes))


@dataclass(frozen=True, slots=True)
class ScaleState:
    """Memory of the scaling decision between evaluations."""

    below_since: float | None = None  # when desired first fell below current (monotonic)


def next_target(
    current: int,
    desired: int,
    ceiling: int,
    min_workers: int,
    state: ScaleState,
    now: float,
    cooldown: float,
) -> tuple[int, ScaleState]:
    """The pool's next worker count. Out fast: on every evaluation, at most doubling (a ramp,
    not a thundering herd of cold starts). In slowly: only after desired stayed below current
    for ``cooldown``, then one worker per evaluation. Never past the ceiling; never below
    min_workers unless the ceiling is lower.

    >>> next_target(1, 8, 6, 1, ScaleState(), now=0.0, cooldown=60.0)[0]
    2
    >>> next_target(4, 8, 6, 1, ScaleState(), now=0.0, cooldown=60.0)[0]
    6
    """
    want = max(min(desired, ceiling), min(min_workers, ceiling))
    if want > current:
        return min(want, max(2 * current, current + 1)), ScaleState()
    if want == current:
        return current, ScaleState()
    if current > ceiling:  # the ceiling dropped (memory measured higher): go down at once
        return ceiling, ScaleState()
    if state.below_since is None:
        return current, ScaleState(now)
    if now - state.below_since >= cooldown:
        return current - 1, state
    return current, state


def saturated(current: int, ceiling: int, oldest_age: float, latency_target: float) -> bool:
    """At its ceiling and still behind its latency target: more load would not help; a human
    must decide (an alert, never more workers)."""
    return current >= ceiling and oldest_age > latency_target
