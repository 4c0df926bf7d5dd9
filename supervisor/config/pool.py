"""One ``[pools.NAME]`` table -> a frozen ``PoolConfig``: the pool's keys declared once, with
their defaults and documentation, and the rules between them.

To add a key, see PoolConfig's docstring; the value checks are in config.values, the handlers
table in config.handlers, the caps, rates and weights tables in config.limits; the rules tying
them to the pool's other keys are at the end of this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from supervisor import units
from supervisor.config.handlers import Handlers
from supervisor.config.keys import FROZEN, IDENTIFIER, key, keys_of, shape, unknown_key
from supervisor.config.limits import KindCaps, KindRates, TenantWeights
from supervisor.config.values import (
    Count,
    Duration,
    Name,
    OptPositive,
    OptRate,
    OptSize,
    Positive,
    Problem,
    Size,
    Unit,
    check_duration,
    check_flag,
    check_fraction,
    choice,
    matching,
    optional,
)
from workers.command_rules import CommandSpec

_MiB = 2**20


def _end_job_tree(value: Any) -> bool | None:
    return None if value is None else check_flag(value)


class PoolConfig(BaseModel):
    """One ``[pools.NAME]`` table: the kinds the pool runs, its workers, and the limits that keep
    a hostile job from taking the pool down. Durations are seconds, sizes are bytes.

    To add a key: declare a field with a default and a one-line description (example_toml()
    documents it), and a field validator when it depends on another key declared above it."""

    model_config = FROZEN

    name: Annotated[str, BeforeValidator(matching(IDENTIFIER.pattern, "a pool name"))] = shape()
    handlers: Handlers = key(
        ...,
        'job kind = "module:function", or = { command = [argv...] }; each kind in exactly one pool',
    )
    min_workers: Count = key(1, "workers kept running even when the pool is idle")
    max_workers: Positive = key(4, "at most this many workers on this host")
    bound: Annotated[str, BeforeValidator(choice("cpu", "io"))] = key(
        "cpu", '"cpu": each worker counts against the cores; "io": it does not'
    )
    memory_limit: OptSize = key(
        512 * _MiB, "a worker whose RSS passes this in a job is stopped; false: no limit"
    )
    job_memory: Size = key(200 * _MiB, "expected peak RSS of one job, for sizing until measured")
    timeout: Duration = key(60.0, "wall-clock limit per job (error_kind timeout)")
    soft_timeout: Annotated[float, BeforeValidator(units.parse_duration), Unit("duration")] = key(
        0.0, "past timeout, raise SoftTimeout in the handler this long before SIGKILL; 0: none"
    )
    lease: Duration = key(60.0, "how long a claim holds a job before it must be extended")
    # The 20s default stands for lease / 3, which _default_heartbeat fills in.
    heartbeat: Duration = key(
        20.0, "how often leases are extended; below lease", example="20s", derived="lease / 3"
    )
    max_lease_extensions: Count = key(30, "a job whose lease needs more is stopped (timeout)")
    max_deliveries: Positive = key(3, "deliveries before a job is dead-lettered")
    retry_backoff: Duration = key(1.0, "first retry delay; doubles, with full jitter")
    retry_backoff_max: Duration = key(600.0, "the longest retry delay")
    retry_budget: Annotated[float | None, BeforeValidator(optional(check_fraction))] = key(
        None, "retries may be at most this share of the pool's deliveries", example="10%"
    )
    latency_target: Duration = key(300.0, "backlog-age objective: the oldest job's age to keep")
    utilization: Annotated[float, BeforeValidator(check_fraction)] = key(
        0.7, "planned busy share of a worker when sizing the pool (queues explode near 100%)"
    )
    scale_in_cooldown: Duration = key(
        60.0, "scale in only after the pool wanted fewer workers for this long"
    )
    max_inflight: OptPositive = key(
        None, "fleet-wide cap on this pool's running jobs, all hosts together", example=50
    )
    tenant_max_inflight: OptPositive = key(
        None, "fleet-wide cap on one tenant's running jobs in this pool", example=10
    )
    kind_max_inflight: KindCaps = Field(
        default_factory=dict,
        description="fleet-wide cap per kind of this pool, e.g. { render = 5 }",
    )
    # ---- fair share between tenants (supervisor/store/fair.py) ----
    fair: Annotated[bool, BeforeValidator(check_flag)] = key(
        True,
        "claim fairly between the tenants of queued jobs; false: strict priority, then FIFO "
        "(a pool with caps always claims fairly)",
    )
    tenant_weights: TenantWeights = Field(
        default_factory=dict,
        description="a tenant's share of the pool against others' (default 1; 0.001 to 1,000,000)",
    )
    # ---- end of fair share ----
    max_jobs_per_worker: OptPositive = key(
        10_000, "a worker is replaced after this many jobs; false: never"
    )
    recycle_rss: OptSize = key(
        None,
        "a worker whose RSS stays above this after a job is replaced (so is one near memory_limit)",
        example="400MiB",
    )
    prefetch: Count = key(0, "jobs claimed ahead of idle workers (each holds a lease meanwhile)")
    pipeline: Positive = key(
        64, "most jobs sent to one worker at once while the pool's jobs are sub-millisecond; 1: off"
    )
    user: Name = key(None, "run workers as this user (fleetd must start as root)", example="fleetd")
    group: Name = key(None, "run workers with this group", example="fleetd")
    nproc_limit: OptPositive = key(
        None, "RLIMIT_NPROC for workers: fork bombs stop there", example=256
    )
    private_shm: Annotated[bool, BeforeValidator(check_flag)] = key(
        True,
        "each worker its own /dev/shm (at most memory_limit), emptied after every job; root only",
    )
    end_job_tree: Annotated[bool | None, BeforeValidator(_end_job_tree)] = key(
        None,
        "kill every process a job left when it ends (Python handlers' helpers kept across jobs "
        "too: a process pool, multiprocessing's resource tracker)",
        example=True,
        derived="true when the pool has a command handler, else false",
    )
    # ---- rate limits: the downstream's own unit (supervisor/rates.py, store/rated.py) ----
    rate_limit: OptRate = key(
        None,
        'fleet-wide starts of this pool\'s jobs, all hosts together: "50/s", "600/m", "1000/h"',
        example="50/s",
    )
    kind_rate_limit: KindRates = Field(
        default_factory=dict,
        description='fleet-wide starts per kind of this pool, e.g. { enrich = "10/s" }',
    )
    rate_burst: OptPositive = key(
        None,
        "jobs rate_limit lets start at once after a quiet spell (a kind's: one second of its rate)",
        example=50,
        derived="one second of rate_limit, at least 1",
    )

    # ---- slots: several jobs at once per worker (io pools; workers/slots.py) ----
    slots: Positive = key(
        1,
        "jobs one worker runs at once, each in a thread (io pools only; a deadline, cancel or "
        "memory kill of one ends the worker, and its other jobs are released)",
    )

    @model_validator(mode="after")
    def _slots_fit(self) -> PoolConfig:
        slots_fit(self)
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_heartbeat(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("heartbeat") is None:
            try:
                lease = check_duration(data.get("lease", 60.0))
            except ValueError:
                return data  # the lease field reports its own error
            return {**data, "heartbeat": lease / 3}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> PoolConfig:
        # After the fields, not in field validators: a default is not validated, and
        # min_workers = 5 must still be checked against the default max_workers of 4.
        _ordered(self, "min_workers", "max_workers", strict=False)
        _ordered(self, "heartbeat", "lease", strict=True)
        _ordered(self, "retry_backoff", "retry_backoff_max", strict=False)
        fair_keys(self)
        kinds_known(self, "kind_max_inflight")
        return self

    @model_validator(mode="after")
    def _rates_consistent(self) -> PoolConfig:
        kinds_known(self, "kind_rate_limit")
        burst_has_rate(self)
        return self

    @property
    def kinds(self) -> tuple[str, ...]:
        """The job kinds this pool runs, in the file's order."""
        return tuple(self.handlers)

    @property
    def ends_job_tree(self) -> bool:
        """``end_job_tree``, or its default: true when a kind of the pool is a command."""
        if self.end_job_tree is not None:
            return self.end_job_tree
        return any(isinstance(h, CommandSpec) for h in self.handlers.values())


def _ordered(pool: PoolConfig, low: str, high: str, *, strict: bool) -> None:
    """``low`` must be below ``high`` (or at most, unless ``strict``). The error names the key
    the user typed: with ``retry_backoff_max = "500ms"`` alone, blaming the default
    retry_backoff would point at a line that is not in the file."""
    a, b = getattr(pool, low), getattr(pool, high)
    if (a < b) if strict else (a <= b):
        return
    relation, too_high, too_low = (
        ("<", "is not below", "is not above") if strict else ("<=", "is above", "is below")
    )
    expected = f"(expected {low} {relation} {high})"
    show = units.format_duration if isinstance(a, float) else int
    if high in pool.model_fields_set and low not in pool.model_fields_set:
        raise Problem(f"{show(b)!r} {too_low} {low} {show(a)!r} {expected}", (high,))
    raise Problem(f"{show(a)!r} {too_high} {high} {show(b)!r} {expected}", (low,))


def named_pool(name: Any, table: Any) -> Any:
    """A pool table with its name filled in from ``[pools.NAME]``."""
    if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
        expected = f"a pool name matching {IDENTIFIER.pattern}"
        raise Problem(f"{name!r} is not a pool name (expected {expected})", (name,))
    if isinstance(table, PoolConfig) and table.name == name:
        return table
    if not isinstance(table, Mapping):
        raise Problem(f"{table!r} is not a table (expected a [pools.{name}] table)", (name,))
    if "name" in table:  # the table's own name: typing it again could only disagree
        raise Problem(unknown_key("name", keys_of(PoolConfig)), (name, "name"))
    return {**table, "name": name}


# ---- the rules tying caps, rates, fair share and slots to the pool's other keys ----------


def slots_fit(pool: PoolConfig) -> None:
    """``slots`` above 1 needs an io pool, no soft timeout, room in nproc_limit for its threads
    and no command handler."""
    # A thread cannot be killed, and a command's runner kills every process of the
    # worker when its job ends (workers.tree.end_all): both need one job per worker.
    if pool.slots > 1 and pool.bound != "io":
        raise Problem(
            f'{pool.slots} needs bound = "io" (a cpu pool runs one job per worker)',
            ("slots",),
        )
    if pool.slots > 1 and pool.soft_timeout > 0:
        raise Problem(
            f"{pool.slots} cannot raise SoftTimeout in a slot's thread (a signal reaches "
            "only a worker's main thread): set soft_timeout = 0 (expected 1)",
            ("slots",),
        )
    if pool.slots > 1 and pool.nproc_limit is not None and pool.nproc_limit <= pool.slots + 1:
        # RLIMIT_NPROC counts threads: a slot's thread could not start
        raise Problem(
            f"{pool.slots} threads do not fit nproc_limit {pool.nproc_limit} (it counts "
            f"threads: the worker needs at least {pool.slots + 2})",
            ("slots",),
        )
    commands = [k for k, h in pool.handlers.items() if isinstance(h, CommandSpec)]
    if pool.slots > 1 and commands:
        raise Problem(
            f"{pool.slots} cannot run command handlers ({', '.join(commands)}): a "
            "command's end kills every process of its worker (expected 1)",
            ("slots",),
        )


def kinds_known(pool: PoolConfig, key: str) -> None:
    """Each kind of the ``key`` table (kind_max_inflight, kind_rate_limit) is one of the pool's."""
    for kind in getattr(pool, key):
        if kind not in pool.handlers:
            known = ", ".join(map(repr, pool.handlers))
            message = f"{kind!r} is not a kind of this pool (expected one of {known})"
            raise Problem(message, (key, kind))


def burst_has_rate(pool: PoolConfig) -> None:
    """``rate_burst`` says how many starts ``rate_limit`` lets through at once: not without it."""
    if pool.rate_burst is not None and pool.rate_limit is None:
        message = f"{pool.rate_burst!r} is set without a rate (expected rate_limit too)"
        raise Problem(message, ("rate_burst",))


def fair_keys(pool: PoolConfig) -> None:
    """``fair = false`` with a cap, or with ``tenant_weights``, would be a key without effect:
    a capped claim always orders fairly (fair.py), and weights are the fair order's."""
    if pool.fair:
        return
    caps = ("max_inflight", "tenant_max_inflight", "kind_max_inflight")
    cap = next((k for k in caps if getattr(pool, k)), None)
    if cap is not None:
        message = f"false with {cap} set (expected true: a pool with caps always claims fairly)"
        raise Problem(message, ("fair",))
    if pool.tenant_weights:
        message = "false with tenant_weights set (expected true: weights order the fair claim)"
        raise Problem(message, ("fair",))
