"""``fleetd start``: load the config, import every handler, open the store, run the fleet.

Everything that can be wrong with the config or the handlers is found here, before a single
worker is forked, and reported in one line with exit status 2.
"""

from __future__ import annotations

from supervisor.config import load_config
from supervisor.imports import import_handlers
from supervisor.observe.logs import setup_logging
from supervisor.run.fleet import Fleet
from supervisor.store import open_store


def run(config_path: str, *, node_id: str | None = None) -> int:
    config = load_config(config_path)
    setup_logging(config.log_format)
    handlers = import_handlers(config)
    store = open_store(config.database)
    try:
        return Fleet(config, store, handlers, node_id=node_id).run()
    finally:
        store.close()
