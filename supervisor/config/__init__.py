"""fleet.toml -> frozen, typed ``FleetConfig``: the schema (fleet, pool, schedule, limits,
handlers), its values and keys, paths, and the rendered example. ``load_config`` and
``parse_config`` (config.load) are the way in; every failure is one ``ConfigError`` line."""

from supervisor.config.example import example_toml
from supervisor.config.fleet import FleetConfig, MemoryBudget
from supervisor.config.load import load_config, parse_config
from supervisor.config.pool import PoolConfig
from supervisor.config.schedule import ScheduleConfig

__all__ = [
    "FleetConfig",
    "MemoryBudget",
    "PoolConfig",
    "ScheduleConfig",
    "example_toml",
    "load_config",
    "parse_config",
]
