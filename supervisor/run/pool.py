"""``Pool``: one pool's workers on this host, how many it wants, and its boot backoff.

The pool forks up to ``target`` workers, each in the lowest free slot (slots name workers in
titles and logs: ``bulk#3``). A worker that dies before it said Ready counts as a boot failure;
after a run of them the pool waits ``policy.respawn_delay`` before the next fork, and says so,
instead of fork-looping. Owned by the supervisor's main thread.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from supervisor.config.pool import PoolConfig
from supervisor.model import ClaimLimits
from supervisor.policy import pipeline_depth, recent_duration, respawn_delay
from supervisor.rates import RateLimit
from supervisor.run.workerproc import WorkerHandle, WorkerState
from workers import tree
from workers.command import runs_commands
from workers.runtime import WorkerSpec

# a pool whose workers retire after at most this many jobs keeps one booted spare worker (when
# it fits under the pool's ceiling), so a job never waits for a fork
SPARE_AT_MOST = 10

# seconds past timeout + soft_timeout at which a worker ends itself (its deadline alarm), if
# the supervisor's own kill, due a second or two earlier, has not come
HARD_DEADLINE_GRACE = 3.0

log = logging.getLogger("fleetd.pool")


@dataclass
class Pool:
    config: PoolConfig
    handlers: dict[str, Callable[[Any], Any]]
    parent_pid: int
    workers: dict[int, WorkerHandle] = field(default_factory=dict)  # by pid
    target: int = 0
    boot_failures: int = 0  # in a row; reset by a worker that reached Ready
    next_spawn_at: float = 0.0
    empty_claims: int = 0  # claims in a row that came back short (adaptive polling)
    next_poll_at: float = 0.0
    recent_duration: float | None = None  # handler time of recent jobs (policy.recent_duration)
    # kinds no job of which may start here: paused fleet-wide (run/controls.py sets it)
    paused_kinds: frozenset[str] = frozenset()
    owed: int = 0  # workers that retired (Recycling) and were reaped before a replacement
    ceiling: int | None = None  # the scaler's last ceiling (max_workers until it has one)
    # a worker at rest, as the kernel counts it (workers.tree.memory_split), measured by the
    # scaler on one ready worker: the pages every worker shares, and those it has alone
    shared_baseline: int | None = None
    private_at_rest: int | None = None
    # the supervisor's directory for its workers' job folders (workers.scratch); None: none
    scratch_root: str | None = None
    # rate limits (store/rated.py), from the last rated claim's reply (monotonic times): no
    # claim before the pool's next token, none of a kind before that kind's; ``rate_held``:
    # that claim left a ready job queued for want of a token
    rate_held_until: float = 0.0
    kind_held_until: dict[str, float] = field(default_factory=dict)
    rate_held: bool = False
    rate_asked: set[str] = field(default_factory=set)  # the kinds of the rated claim in flight

    def __post_init__(self) -> None:
        self.target = self.config.min_workers

    @property
    def name(self) -> str:
        return self.config.name

    @cached_property
    def runs_commands(self) -> bool:
        """Whether a kind of this pool is an external program (``workers.command``): only
        those jobs get folders, so only such a pool's workers make a directory for them."""
        return runs_commands(self.handlers)

    @property
    def kinds(self) -> set[str]:
        return set(self.config.handlers)

    @property
    def claimable(self) -> set[str]:
        """The kinds it may claim now: all but the paused ones."""
        return self.kinds - self.paused_kinds

    @property
    def paused(self) -> bool:
        """Every kind of it is paused: it starts nothing."""
        return not self.claimable

    def idle(self) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.state == WorkerState.IDLE]

    def busy(self) -> list[WorkerHandle]:
        return [w for w in self.workers.values() if w.state == WorkerState.BUSY]

    def watched(self) -> list[WorkerHandle]:
        """Workers whose running jobs the watchdog and the lease expiry look at: the busy
        ones, and a worker with slots that said Recycling (it exits only once its other
        slots are done, which may take until their deadline)."""
        return [w for w in self.workers.values() if w.watched]

    @property
    def limits(self) -> ClaimLimits:
        """The pool's fleet-wide caps and its order between tenants, as the store's claim
        takes them."""
        c = self.config
        return ClaimLimits(
            c.max_inflight,
            c.tenant_max_inflight,
            c.kind_max_inflight,
            fair=c.fair,
            weights=c.tenant_weights,
        )

    @cached_property
    def rate(self) -> RateLimit | None:
        """The pool's rate limits as the store's claim takes them, or None."""
        c = self.config
        return RateLimit.of(c.rate_limit, c.rate_burst, c.kind_rate_limit)

    def rate_gate(self) -> float:
        """When the pool may claim next by its rate limits (monotonic; 0: any time): after
        the pool's next token, and after the first of its claimable kinds' next tokens."""
        if self.rate is None:
            return 0.0
        kinds = min((self.kind_held_until.get(k, 0.0) for k in self.claimable), default=0.0)
        return max(self.rate_held_until, kinds)

    def rate_wake(self, now: float) -> float:
        """When the first held kind's next token is due (monotonic; 0: none is held)."""
        return min((t for t in self.kind_held_until.values() if t > now), default=0.0)

    def rate_kinds(self, now: float) -> set[str]:
        """The claimable kinds whose rate has a token now."""
        return {k for k in self.claimable if self.kind_held_until.get(k, 0.0) <= now}

    def depth(self) -> int:
        """Jobs one worker may hold (policy.pipeline_depth). 1 under a fleet-wide cap: a
        queued job holds a lease, and so a place under the cap, without running; 1 under a
        rate limit: a token is spent at the claim, so the job should start then. A worker
        with slots holds as many as it runs at once, none queued behind them."""
        if self.config.slots > 1:
            return self.config.slots
        if self.limits.capped or self.rate is not None:
            return 1
        return pipeline_depth(self.recent_duration, self.config.pipeline)

    @property
    def threaded(self) -> bool:
        """Its workers run the slot runtime (workers/slots.py): slots, or an ``async def``
        handler (a task on the worker's event loop, even with one slot)."""
        return self.config.slots > 1 or bool(self.async_kinds)

    @functools.cached_property
    def async_kinds(self) -> frozenset[str]:
        """Kinds whose handler is an ``async def`` (detected at import)."""
        return frozenset(k for k, h in self.handlers.items() if inspect.iscoroutinefunction(h))

    def job_took(self, duration: float) -> None:
        self.recent_duration = recent_duration(self.recent_duration, duration)

    def spares(self) -> int:
        """Booted workers kept idle beside ``target``: one where workers retire after a job
        or a few (``SPARE_AT_MOST``), when it fits under the ceiling (a spare counts against
        it, and so against the memory budget, like any worker), none otherwise or at zero."""
        recycle = self.config.max_jobs_per_worker
        if recycle is None or recycle > SPARE_AT_MOST or self.target == 0:
            return 0
        ceiling = self.ceiling if self.ceiling is not None else self.config.max_workers
        return 1 if self.target < ceiling else 0

    def wanted(self) -> int:
        """Workers to keep: the target and the spare."""
        return self.target + self.spares()

    def running_cap(self) -> int | None:
        """How many workers may hold jobs at once while a spare is kept (the target), else
        None: every worker may."""
        return self.target if self.spares() else None

    def measure_memory(self) -> None:
        """Read the shared and private memory of one ready worker (the longest-lived idle
        one: its boot's copy-on-write is done)."""
        ready = sorted(self.idle(), key=lambda w: w.spawned_at)
        for worker in ready[:1]:
            split = tree.memory_split(worker.pid)
            if split is not None:
                self.private_at_rest, self.shared_baseline = split

    def live(self) -> int:
        """Workers that count towards the target (not those being killed)."""
        return sum(1 for w in self.workers.values() if w.state != WorkerState.STOPPING)

    def spawn_due(self, now: float) -> bool:
        return self.live() < self.wanted() and now >= self.next_spawn_at

    def spec(self) -> WorkerSpec:
        """The spec of the next worker: the lowest free slot."""
        used = {w.slot for w in self.workers.values()}
        slot = next(i for i in range(1, len(used) + 2) if i not in used)
        c = self.config
        return WorkerSpec(
            pool=c.name,
            slot=slot,
            handlers=self.handlers,
            parent_pid=self.parent_pid,
            memory_limit=c.memory_limit,
            max_jobs_per_worker=c.max_jobs_per_worker,
            recycle_rss=c.recycle_rss,
            nproc_limit=c.nproc_limit,
            user=c.user,
            group=c.group,
            hard_deadline=c.timeout + (c.soft_timeout or 0.0) + HARD_DEADLINE_GRACE,
            private_shm=c.private_shm,
            scratch_root=self.scratch_root,
            end_job_tree=c.ends_job_tree,
            slots=c.slots,
            threaded=self.threaded,
        )

    def take_replacement(self) -> bool:
        """Whether the next fork replaces a worker that retired after its job (one said
        Recycling and is still exiting, or was reaped unreplaced); counts it as replaced."""
        if self.owed:
            self.owed -= 1
            return True
        return any(w.recycling for w in self.workers.values())

    def worker_gone(self, worker: WorkerHandle, booted: bool, now: float) -> None:
        """Forget a reaped worker; back off when workers keep dying before they are ready."""
        self.workers.pop(worker.pid, None)
        if worker.recycling and self.live() < self.wanted():
            self.owed += 1
        if booted or worker.kill_reason is not None:
            self.boot_failures = 0
            return
        delay = self.boot_failed(now)
        log.warning(
            "pool %s: worker %s died before it was ready (%d in a row); next fork in %.1fs",
            self.name,
            worker.name,
            self.boot_failures,
            delay,
        )

    def boot_failed(self, now: float) -> float:
        """A worker that never became ready (or was never forked): the next fork waits,
        longer each time in a row. The wait, in seconds."""
        self.boot_failures += 1
        delay = respawn_delay(self.boot_failures)
        self.next_spawn_at = now + delay
        return delay
