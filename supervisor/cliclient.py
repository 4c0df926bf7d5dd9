"""The Client a ``fleetd`` command works through, and what the commands read and check with it
apart from the command line itself: the --pool filter and a pause's pool and kind checked
against the config, the fleet view as ``fleetd status`` shows it, cancelled jobs waited for.

Errors are fleetd's typed ones; the cli turns them into one line and an exit status
(``supervisor.cli.options.friendly``). The heavy imports (the client, the store) wait until a
command needs them, so ``fleetd --help`` stays quick.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from supervisor.errors import UnknownKind, UnknownPool

CANCEL_WAIT = 5.0  # seconds ``fleetd cancel`` waits to see running jobs stopped


def open_client(config_path: str, *, create: bool = False, pool: str | None = None) -> Any:
    """A client on the config's database. Only ``enqueue`` creates a SQLite database that is
    not there yet (as ``fleetd start`` does): a command that reads or fixes up jobs meets a
    mistyped path with an error, not with a new empty queue that looks healthy. ``pool``, a
    --pool filter, must name a pool of the config or one that has jobs in the database (another
    host's config, a pool since removed): a typo would match nothing, silently."""
    from supervisor.client import Client

    client = Client.from_config(config_path, create=create)
    config = client.config
    if pool is None or pool in config.pools:
        return client
    with contextlib.ExitStack() as on_error:  # closed unless handed back
        on_error.callback(client.close)
        if not client.store.list_jobs(pool=pool, limit=1):
            known = ", ".join(config.pools)
            raise UnknownPool(
                f"{config.path.name}: no pool {pool!r} here or in the database (pools: {known})"
            )
        on_error.pop_all()
    return client


def fleet_view(client: Any) -> Any:
    """The fleet as ``fleetd status`` shows it: node rows and the store's queue figures."""
    from supervisor.observe.fleetview import build_view
    from supervisor.observe.schedview import summarize
    from supervisor.store import display_url

    config = client.config
    read = client.store.schedule_states()
    return build_view(
        fleet=config.name,
        database=display_url(config.database),
        configured=config.pools,
        stats=client.store.stats(list(config.pools)),
        rows=client.store.list_nodes(),
        now=read.now,
        schedules=summarize(config.schedule_specs(), read.states, read.now),
        pauses=client.store.pauses(),
    )


def check_pool_and_kind(client: Any, pool: str, kind: str | None) -> None:
    """POOL must be a pool of the config, KIND one of its kinds: a typo pauses nothing."""
    config = client.config
    if pool not in config.pools:
        known = ", ".join(config.pools)
        raise UnknownPool(f"{config.path.name}: no pool {pool!r} (pools: {known})")
    kinds = config.pools[pool].handlers
    if kind is not None and kind not in kinds:
        raise UnknownKind(f"pool {pool!r} has no kind {kind!r} (kinds: {', '.join(kinds)})")


def wait_stopped(client: Any, ids: list[int]) -> list[str]:
    """Wait up to CANCEL_WAIT for running jobs whose cancel was requested to end."""
    from supervisor.actions import stopped_lines

    start = time.monotonic()
    jobs = client.wait_all(ids, CANCEL_WAIT, partial=True)  # woken as each one ends
    return stopped_lines(jobs, round(time.monotonic() - start, 1))
