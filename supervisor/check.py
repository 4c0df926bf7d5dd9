"""``fleetd check``: validate a fleet.toml, import its handlers, and describe each pool.

The plan is a plain dict (``--json`` prints it as is); ``render_plan`` makes it readable.
"""

from __future__ import annotations

from typing import Any

from supervisor.config import FleetConfig, load_config
from supervisor.imports import import_handlers
from supervisor.store import display_url
from supervisor.units import format_duration, format_size


def plan_for(config_path: str) -> dict[str, Any]:
    """Load and validate the config, import every handler, and return the plan."""
    config = load_config(config_path)
    import_handlers(config)
    return {
        "config": str(config.path),
        "fleet": config.name,
        "database": display_url(config.database),
        "pools": {name: _pool_plan(config, name) for name in config.pools},
    }


def _pool_plan(config: FleetConfig, name: str) -> dict[str, Any]:
    pool = config.pools[name]
    return {
        "kinds": list(pool.kinds),
        "min_workers": pool.min_workers,
        "max_workers": pool.max_workers,
        "bound": pool.bound,
        "memory_limit": pool.memory_limit,
        "timeout": pool.timeout,
        "lease": pool.lease,
        "heartbeat": pool.heartbeat,
        "max_deliveries": pool.max_deliveries,
    }


def render_plan(plan: dict[str, Any]) -> str:
    """The plan as a few lines per pool."""
    lines = [f"{plan['config']}: OK (fleet {plan['fleet']!r}, database {plan['database']})"]
    for name, p in plan["pools"].items():
        limit = format_size(p["memory_limit"]) if p["memory_limit"] else "none"
        lines.append(
            f"  pool {name}: kinds {', '.join(p['kinds'])}; workers {p['min_workers']}.."
            f"{p['max_workers']} ({p['bound']}); memory_limit {limit}; "
            f"timeout {format_duration(p['timeout'])}; lease {format_duration(p['lease'])} "
            f"(heartbeat {format_duration(p['heartbeat'])}); max_deliveries {p['max_deliveries']}"
        )
    return "\n".join(lines)
