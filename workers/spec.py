"""What a worker is told before the fork: ``WorkerSpec``, checked in the parent, and the lines
of its recycling that follow from the spec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from workers import limits, protocol
from workers.handlers import Handler

MIB = 1024 * 1024
NEAR_LIMIT = 7 / 8  # of memory_limit: RSS after a job above it replaces the worker
ROOM_TO_GROW = 16 * MIB  # ... unless its first job left it closer to it than this


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, fixed before the fork.

    ``handlers`` are already imported (``workers.handlers.load_handlers``). Sizes are bytes.
    ``memory_limit`` caps memory through the ``rlimit_policy`` rlimit ("data", "as" or "off")
    at ``memory_limit + rlimit_headroom`` (see ``workers.limits``); the exact limit on RSS is
    the parent's watchdog. ``recycle_rss``: exit after a job that leaves RSS above it (and,
    with a ``memory_limit``, after one that leaves it near that: ``NEAR_LIMIT``).
    ``user``/``group`` (names or ids) need the parent to run as root.
    """

    pool: str
    slot: int
    handlers: Mapping[str, Handler]
    parent_pid: int
    memory_limit: int | None = None
    rlimit_policy: str = "data"
    rlimit_headroom: int = limits.DEFAULT_HEADROOM
    max_jobs_per_worker: int | None = None
    recycle_rss: int | None = None
    nproc_limit: int | None = None
    user: str | int | None = None
    group: str | int | None = None
    max_frame: int = protocol.MAX_FRAME
    # an fd on the cgroup.procs of the worker's memory cgroup, made by the parent before the
    # fork: the worker joins it itself, first thing (None: no cgroup, or the parent moved it)
    cgroup_fd: int | None = None
    # a private /dev/shm (workers.tree.private_shm), at most memory_limit in size, emptied
    # after every job; needs root (else the host's is shared, and said once on stderr)
    private_shm: bool = False
    # seconds after a job starts at which the worker ends itself (``limits.DeadlineAlarm``):
    # a backstop behind the parent's own kill, which comes earlier (timeout, soft window).
    # None: no alarm
    hard_deadline: float | None = None
    # the supervisor's directory under which this worker makes its own for its command jobs'
    # folders (workers.scratch); the supervisor removes the worker's when it reaps it
    scratch_root: str | None = None
    # kill what a job left running when it ends (workers.tree.end_all); a command's own
    # processes are killed by its runner whatever this says
    end_job_tree: bool = True
    # jobs run at once, each in a thread or an asyncio task (workers/slots.py); ``threaded``:
    # run the slot runtime even with one slot (a pool with an ``async def`` handler)
    slots: int = 1
    threaded: bool = False

    def __post_init__(self) -> None:
        # Checked in the parent, before the fork: a bad spec must not become a fork loop.
        if self.rlimit_policy not in limits.POLICIES:
            raise ValueError(f"rlimit_policy {self.rlimit_policy!r} not in {limits.POLICIES}")
        for name in ("memory_limit", "max_jobs_per_worker", "recycle_rss", "nproc_limit"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, not {value!r}")
        if self.rlimit_headroom < 0:
            raise ValueError(f"rlimit_headroom must not be negative, not {self.rlimit_headroom}")
