"""Building a fleet: ``build_fleet`` makes its ``Parts`` (the owners the loop drives) from a
config, an open store and the imported handlers, and hands them to ``Fleet``. Nothing is
started here: the boot (``Fleet.boot``) opens the loop, the forker, the store processes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from supervisor import host
from supervisor.clock import Clock, SystemClock
from supervisor.config.fleet import FleetConfig
from supervisor.observe.observer import Observer
from supervisor.run.controls import Controls
from supervisor.run.counters import Counters
from supervisor.run.dispatch import Dispatcher
from supervisor.run.drain import Drain
from supervisor.run.fleet import Fleet
from supervisor.run.forklink import ForkLink
from supervisor.run.hooks import NO_HOOKS, Hooks
from supervisor.run.housekeeping import Housekeeping
from supervisor.run.link import Link
from supervisor.run.memcg import MemoryCgroups
from supervisor.run.parts import Parts
from supervisor.run.pinger import Pinger
from supervisor.run.pool import Pool
from supervisor.run.scaler import Scaler
from supervisor.run.scheduler import Scheduler
from supervisor.run.storelink import ProcessLink
from supervisor.run.storeprocs import StoreProcesses
from supervisor.store import Store


def build_fleet(
    config: FleetConfig,
    store: Store,
    handlers: dict[str, dict[str, Callable[[Any], Any]]],
    node_id: str | None = None,
    clock: Clock | None = None,
    link: Link | None = None,
    forker: ForkLink | None = None,
    *,
    hooks: Hooks = NO_HOOKS,
    config_label: str | None = None,
) -> Fleet:
    """A fleet ready to ``run``. ``link``: one link for every store call (tests: an
    ``InlineLink``), else two store processes; ``forker``: one started already (``fleetd
    start`` starts it before the heavy imports), else the boot starts one; ``hooks``: test
    seams (run/hooks.py); ``config_label``: the config as the command line named it."""
    clock = clock or SystemClock()
    pid = os.getpid()
    # after boot every store call goes through a link to a process of the supervisor's own,
    # so the loop never waits for the database: ``link`` for the jobs (claims, extends,
    # results; wake-ups), and ``chores`` for what may take long (the reaper and its VACUUM,
    # prune, the figures, the node row), so an extend never queues behind a slow chore
    link_: Link = link or ProcessLink(
        config.database, title=config.name, listen=True, wrap_store=hooks.wrap_store
    )
    chores: Link = link or ProcessLink(
        config.database, title=f"{config.name} chores", listen=False, wrap_store=hooks.wrap_store
    )
    processes = StoreProcesses([p for p in (link_, chores) if isinstance(p, ProcessLink)])
    node_id = node_id or f"{socket.gethostname()}-{pid}"
    pools = {
        name: Pool(pool_config, handlers[name], pid) for name, pool_config in config.pools.items()
    }
    counters = Counters()
    dispatcher = Dispatcher(link_, pools, node_id, clock, counters)
    return Fleet(
        Parts(
            config=config,
            config_label=config_label or str(config.path),
            store=store,
            handlers=handlers,
            clock=clock,
            node_id=node_id,
            pid=pid,
            hooks=hooks,
            link=link_,
            chores=chores,
            processes=processes,
            # wake-ups reach the link's store process (LISTEN; SQLite's datagram socket),
            # which runs an armed claim at once: the loop binds SQLite's socket itself only
            # without one
            loop_wakes=store.dialect == "sqlite" and not isinstance(link_, ProcessLink),
            pools=pools,
            counters=counters,
            dispatcher=dispatcher,
            housekeeping=Housekeeping(chores, clock, counters, dispatcher.health),
            # pauses and cancels, read on the link several times a second (run/controls.py)
            controls=Controls(link_, pools, dispatcher, node_id, clock, dispatcher.health),
            scheduler=Scheduler(chores, config.schedule_specs(), clock, dispatcher.health),
            scaler=Scaler(
                chores,
                pools,
                cores=host.usable_cores(),
                memory_budget=config.memory_budget.bytes_of(host.total_memory()),
                interval=config.scale_interval,
                started=clock.monotonic(),
            ),
            drain=Drain(config.grace_period),
            memcg=MemoryCgroups(enabled=config.memory_cgroup, pid=pid),
            observer=Observer(
                config, node_id=node_id, hostname=socket.gethostname(), pid=pid, clock=clock
            ),
            pinger=Pinger(),
            reap_interval=min(10.0, max(0.5, min(p.lease for p in config.pools.values()) / 4)),
            forker=forker,
        )
    )
