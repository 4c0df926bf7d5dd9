"""``fleetd start``: load the config, import every handler, start the forker, open the store,
run the fleet.

Everything that can be wrong with the config or the handlers is found here, before a single
worker is forked, and reported in one line with exit status 2. The forker (workers/forker.py)
is a fresh interpreter that imports the handlers itself while the store opens; the fleet
forks no worker before it says it is ready.
"""

from __future__ import annotations

import time

from supervisor.config import load_config
from supervisor.errors import HandlerError
from supervisor.imports import handler_refs, import_handlers
from supervisor.observe.logs import setup_logging
from supervisor.run.forklink import BOOT_LIMIT, ForkerGone, start_forker
from supervisor.run.hooks import NO_HOOKS, Hooks


def run(config_path: str, *, node_id: str | None = None, hooks: Hooks = NO_HOOKS) -> int:
    """Run the fleet of ``config_path`` until it stops; its exit status. ``hooks``: test
    seams (run/hooks.py), given only by tests/support/hooked_start.py."""
    config = load_config(config_path)
    setup_logging(config.log_format)
    started = time.monotonic()
    handlers = import_handlers(config)
    # the forker imports the same modules: give it the time this took, several times over
    boot_limit = max(BOOT_LIMIT, 5 * (time.monotonic() - started))
    try:
        forker = start_forker(handlers, handler_refs(config), boot_limit=boot_limit)
    except ValueError as exc:  # a handler the forker can neither import nor unpickle
        raise HandlerError(f"{config.path}: {exc}") from None
    try:
        # imported only now: a config or handler error is reported before the driver loads
        from supervisor.run.build import build_fleet
        from supervisor.store import open_store

        store = open_store(config.database)
        try:
            try:  # the handlers' imports, in the forker: meanwhile the store opened
                forker.await_ready(boot_limit)
            except ForkerGone as exc:
                raise HandlerError(f"{config.path}: {exc}") from None
            fleet = build_fleet(
                config,
                store,
                handlers,
                node_id=node_id,
                forker=forker,
                hooks=hooks,
                config_label=config_path,
            )
            return fleet.run()
        finally:
            store.close()
    finally:
        forker.close(1.0)  # stopped already unless the start failed
