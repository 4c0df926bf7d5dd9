"""A fleet.toml's ``[fleet]`` keys and its tables -> a frozen ``FleetConfig``; the memory budget
(``MemoryBudget``); which pool runs a kind, and the schedules as the supervisor runs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ValidationInfo,
    field_validator,
    model_validator,
)

from supervisor import schedules, units
from supervisor.config.keys import FROZEN, key, shape
from supervisor.config.paths import (
    environ_of,
    folder_of,
    resolve_database_url,
    resolve_python_path,
)
from supervisor.config.pool import PoolConfig, named_pool
from supervisor.config.schedule import ScheduleConfig, named_schedule
from supervisor.config.values import (
    Duration,
    Problem,
    check_address,
    check_flag,
    check_fraction,
    check_size,
    choice,
    matching,
    optional,
)
from supervisor.errors import UnknownKind


class MemoryBudget(BaseModel):
    """RSS this host's workers may use, all pools together: a fraction of the host's memory (or of
    the container's limit) or an absolute number of bytes. Exactly one of the two is set."""

    model_config = FROZEN
    fraction: float | None = None
    size: int | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> MemoryBudget:
        if (self.fraction is None) == (self.size is None):
            raise ValueError("a memory budget is a fraction or a size (expected exactly one)")
        return self

    @classmethod
    def parse(cls, value: Any) -> MemoryBudget:
        """``"80%"`` -> a fraction, ``"4GiB"`` or a number of bytes -> a size."""
        if isinstance(value, MemoryBudget):
            return value
        if isinstance(value, str) and value.strip().endswith("%"):
            return cls(fraction=check_fraction(value))
        try:
            return cls(size=check_size(value))
        except ValueError:
            expected = 'a percentage such as "80%" or a size such as "4GiB"'
            raise ValueError(f"{value!r} is not a memory budget (expected {expected})") from None

    def bytes_of(self, total_bytes: int) -> int:
        """The budget in bytes on a host (or container) with ``total_bytes`` of memory. An
        absolute budget is returned as configured, even above ``total_bytes``."""
        if self.size is not None:
            return self.size
        return int(total_bytes * (self.fraction or 0.0))

    def __str__(self) -> str:
        if self.size is not None:
            return units.format_size(self.size)
        return f"{(self.fraction or 0.0) * 100:g}%"


class FleetConfig(BaseModel):
    """A validated fleet.toml: the ``[fleet]`` keys and the pools, in the file's order. Paths are
    absolute and the database URL fully resolved, so nothing depends on the working directory."""

    model_config = FROZEN

    path: Annotated[Path, AfterValidator(lambda p: Path(os.path.abspath(p)))] = shape()
    name: Annotated[str, BeforeValidator(matching(r"[A-Za-z0-9_.-]+", "letters, digits, _.-"))] = (
        key(
            ...,
            "the fleet's name in logs, metrics and status",
            example="fleet",
            derived="the file's name",
        )
    )
    database: str = key(
        "sqlite:///fleetd.db",
        'SQLAlchemy URL; SQLite paths are relative to this file; "${VAR}" reads the environment',
        validate_default=True,
    )
    python_path: tuple[Path, ...] = key(
        (".",),
        "folders put on sys.path to import handlers, relative to this file",
        validate_default=True,
    )
    grace_period: Duration = key(30.0, "on SIGTERM or SIGINT, how long running jobs may finish")
    metrics: Annotated[str | None, BeforeValidator(optional(check_address))] = key(
        None, '"host:port" serving /metrics and /healthz', example="127.0.0.1:9464"
    )
    memory_budget: Annotated[MemoryBudget, BeforeValidator(MemoryBudget.parse)] = key(
        MemoryBudget(fraction=0.8), "RSS all workers here may use: a share of memory, or a size"
    )
    memory_cgroup: Annotated[bool, BeforeValidator(check_flag)] = key(
        True,
        "a cgroup per worker at memory_limit + 128MiB where the host allows it (fleetd check)",
    )
    retention: Duration = key(7 * 86400.0, "done jobs are pruned after this long")
    scale_interval: Duration = key(2.0, "how often each pool's size is re-evaluated")
    log_format: Annotated[str, BeforeValidator(choice("human", "json"))] = key(
        "human", '"human", or "json" for one JSON object a line'
    )
    pools: Mapping[str, PoolConfig] = shape(default_factory=dict, validate_default=True)
    schedules: Mapping[str, ScheduleConfig] = shape(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "name" not in data and data.get("path") is not None:
            return {**data, "name": Path(data["path"]).stem}
        return data

    @field_validator("database", mode="before")
    @classmethod
    def _resolve_database(cls, value: Any, info: ValidationInfo) -> str:
        return resolve_database_url(value, folder_of(info), environ_of(info))

    @field_validator("python_path", mode="before")
    @classmethod
    def _resolve_python_path(cls, value: Any, info: ValidationInfo) -> tuple[Path, ...]:
        return resolve_python_path(value, folder_of(info))

    @field_validator("pools", mode="before")
    @classmethod
    def _name_pools(cls, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError(f"{value!r} is not a table (expected [pools.NAME] tables)")
        if not value:
            raise ValueError("no pools (expected at least one [pools.NAME] table with handlers)")
        return {name: named_pool(name, table) for name, table in value.items()}

    @field_validator("pools")
    @classmethod
    def _one_pool_per_kind(cls, pools: Mapping[str, PoolConfig]) -> Mapping[str, PoolConfig]:
        owner: dict[str, str] = {}
        for pool in pools.values():
            for kind in pool.handlers:
                if kind in owner:
                    message = (
                        f"{kind!r} is handled by pool {owner[kind]!r} and by pool {pool.name!r} "
                        "(expected each kind in exactly one pool)"
                    )
                    raise Problem(message, (pool.name, "handlers", kind))
                owner[kind] = pool.name
        return pools

    @field_validator("schedules", mode="before")
    @classmethod
    def _name_schedules(cls, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError(f"{value!r} is not a table (expected [schedules.NAME] tables)")
        return {name: named_schedule(name, table) for name, table in value.items()}

    @field_validator("schedules")
    @classmethod
    def _known_kinds(
        cls, value: Mapping[str, ScheduleConfig], info: ValidationInfo
    ) -> Mapping[str, ScheduleConfig]:
        pools = info.data.get("pools")
        if pools is None:
            return value  # the pools' own error is reported
        kinds = [kind for pool in pools.values() for kind in pool.handlers]
        for name, schedule in value.items():
            if schedule.kind not in kinds:
                known = ", ".join(map(repr, kinds))
                message = f"{schedule.kind!r} is not a kind of any pool (expected one of {known})"
                raise Problem(message, (name, "kind"))
        return value

    def schedule_specs(self) -> tuple[schedules.ScheduleSpec, ...]:
        """Every schedule as the supervisor runs it (the kind routed to its pool)."""
        out = []
        for s in self.schedules.values():
            pool = self.pool_for_kind(s.kind)
            out.append(
                schedules.ScheduleSpec(
                    name=s.name,
                    timing=s.timing(),
                    kind=s.kind,
                    pool=pool.name,
                    max_deliveries=pool.max_deliveries,
                    payload=s.payload,
                    tenant=s.tenant,
                    priority=s.priority,
                    catch_up=s.catch_up,
                    catch_up_max=s.catch_up_max,
                    overlap=s.overlap,
                )
            )
        return tuple(out)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind this fleet runs, pool by pool in the file's order."""
        return tuple(kind for pool in self.pools.values() for kind in pool.handlers)

    def pool_for_kind(self, kind: str) -> PoolConfig:
        """The pool that runs ``kind``; UnknownKind (listing the known kinds) if none does."""
        # A scan, not a cached index: a handful of pools, and model_copy() cannot leave it stale.
        for pool in self.pools.values():
            if kind in pool.handlers:
                return pool
        known = ", ".join(map(repr, self.kinds))
        raise UnknownKind(f"{self.path.name}: no pool handles kind {kind!r} (known: {known})")

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """``metrics`` split for bind(): ("127.0.0.1", 9464); IPv6 brackets removed."""
        if self.metrics is None:
            return None
        host, _, port = self.metrics.rpartition(":")
        return host.strip("[]"), int(port)
