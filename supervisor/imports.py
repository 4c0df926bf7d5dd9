"""Import every pool's handlers in the parent, before any fork.

The config's ``python_path`` goes first on ``sys.path``. A handler that cannot be imported is a
``HandlerError`` naming the pool, the kind, the spec and the cause in one line, so ``fleetd
start`` and ``fleetd check`` stop before a worker is forked.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from supervisor.config.fleet import FleetConfig
from supervisor.errors import HandlerError
from workers.errors import HandlerImportError
from workers.handlers import load_handlers


def add_python_path(config: FleetConfig) -> None:
    """Put the config's folders first on ``sys.path`` (once each)."""
    for folder in reversed(config.python_path):
        entry = str(folder)
        if entry not in sys.path:
            sys.path.insert(0, entry)


def import_handlers(config: FleetConfig) -> dict[str, dict[str, Callable[[Any], Any]]]:
    """pool name -> kind -> callable, for every pool of ``config``."""
    add_python_path(config)
    loaded: dict[str, dict[str, Callable[[Any], Any]]] = {}
    for name, pool in config.pools.items():
        try:
            loaded[name] = load_handlers(pool.handlers)
        except HandlerImportError as exc:
            raise HandlerError(f"{config.path}: pools.{name}: {exc}") from exc
    return loaded


def handler_refs(config: FleetConfig) -> dict[str, dict[str, str]]:
    """pool name -> kind -> ``"module:function"``, for every kind that names a function (the
    names the forker imports them by: supervisor.run.forklink)."""
    return {
        name: {kind: spec for kind, spec in pool.handlers.items() if isinstance(spec, str)}
        for name, pool in config.pools.items()
    }
