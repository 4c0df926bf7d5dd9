"""``Parts``: what a fleet is made of, built once by ``run/build.py`` and shared by the loop
(``run/fleet.py``) and its helpers (``run/children.py``, ``run/stopping.py``,
``run/wakeups.py``, ``run/publisher.py``).

Every field is owned by the supervisor's main thread. The owners (dispatcher, controls,
scaler, pools, ...) are made at construction; ``loop``, ``forker``, ``waker``, ``metrics`` and
``scratch_root`` are the resources the boot opens and the shutdown closes (None before or
without them).
"""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass, field
from typing import Any

from setproctitle import setproctitle

from supervisor.clock import Clock
from supervisor.config.fleet import FleetConfig
from supervisor.observe.observer import Observer
from supervisor.observe.server import MetricsServer
from supervisor.run.controls import Controls
from supervisor.run.counters import Counters
from supervisor.run.dispatch import Dispatcher
from supervisor.run.drain import Drain
from supervisor.run.forklink import ForkLink
from supervisor.run.hooks import Hooks
from supervisor.run.housekeeping import Housekeeping
from supervisor.run.link import Link
from supervisor.run.loop import Loop
from supervisor.run.memcg import MemoryCgroups
from supervisor.run.pinger import Pinger
from supervisor.run.pool import Pool
from supervisor.run.scaler import Scaler
from supervisor.run.scheduler import Scheduler
from supervisor.run.storeprocs import StoreProcesses
from supervisor.run.workerproc import WorkerHandle
from supervisor.store import Store


@dataclass(eq=False)
class Parts:
    config: FleetConfig
    config_label: str  # the config file as given on the command line (the process title)
    store: Store  # at boot only (migrated, node registered); then every call goes by a link
    handlers: dict[str, dict[str, Any]]
    clock: Clock
    node_id: str
    pid: int
    hooks: Hooks
    link: Link  # the jobs' store calls (claims, extends, results)
    chores: Link  # what may take long (reaper, prune, figures, node row)
    processes: StoreProcesses  # the links that are processes of ours
    loop_wakes: bool  # the loop binds SQLite's wake-up socket itself (no store process)
    pools: dict[str, Pool]
    counters: Counters
    dispatcher: Dispatcher
    housekeeping: Housekeeping
    controls: Controls
    scheduler: Scheduler
    scaler: Scaler
    drain: Drain
    memcg: MemoryCgroups
    observer: Observer
    pinger: Pinger
    reap_interval: float
    rng: random.Random = field(default_factory=random.Random)
    # opened by the boot, closed by the shutdown
    loop: Loop | None = None
    forker: ForkLink | None = None  # started before the heavy imports, or at boot
    waker: Any = None  # SQLite's wake-up socket, when the loop binds it (run/wakeups.py)
    metrics: MetricsServer | None = None
    scratch_root: str | None = None  # the workers' job folders (workers.scratch)

    def workers(self) -> list[WorkerHandle]:
        """Every worker of every pool, now."""
        return [w for p in self.pools.values() for w in p.workers.values()]

    def set_title(self) -> None:
        """``fleetd: supervisor [fleet] conf/fleet.toml 2 pools 4 workers``: two fleets on a
        host tell apart in ``ps``."""
        workers = sum(len(p.workers) for p in self.pools.values())
        setproctitle(
            f"fleetd: supervisor [{self.config.name}] {self.config_label} "
            f"{len(self.pools)} pools {workers} workers"
        )

    def child_cleanup(self) -> None:
        """In a new worker or store process: close the parent's loop, sockets and wake-up
        channel."""
        if self.loop is not None:
            self.loop.reset_in_child()
        for process in self.processes:
            if process.sock is not None:
                process.sock.close()
        if self.forker is not None:
            self.forker.close_socket()
            self.forker.pid = None  # not this process's child: never waited for here
        for pool in self.pools.values():
            for other in pool.workers.values():
                other.sock.close()
                if other.cancel_slot is not None:
                    other.cancel_slot.close()  # a sibling's: never written here
                    other.cancel_slot = None
        if self.waker is not None:
            with contextlib.suppress(OSError):
                os.close(self.waker.fileno())
        if self.metrics is not None:
            self.metrics.close_in_child()
