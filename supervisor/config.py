"""fleet.toml -> frozen, typed ``FleetConfig`` and ``PoolConfig``.

Why pydantic: one declarative schema (the field declarations below) yields the validation, the
defaults and the documented example (``example_toml()`` renders conf/fleet.example.toml from the
field descriptions), and ``extra="forbid"`` rejects unknown keys instead of ignoring a typo.
Pydantic stays behind this module: its ValidationError is translated here, once, into a one-line
``ConfigError``::

    <file>: <key path>: <the bad value's repr and what was wrong> (expected <what>)

Values go through ``supervisor.units``, so "250ms", "512MiB" and "80%" mean the same here as on
the command line. Everything is checked at load; nothing is read from the environment at import.
The models are frozen; their mappings are plain dicts that nobody may mutate.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from supervisor import schedules, units
from supervisor.errors import ConfigError, UnknownKind
from supervisor.model import NAME_MAX, PRIORITY_MAX, PRIORITY_MIN
from workers.command import CommandSpec, placeholder_names

__all__ = [
    "FleetConfig",
    "MemoryBudget",
    "PoolConfig",
    "ScheduleConfig",
    "example_toml",
    "load_config",
    "parse_config",
]

_MiB = 2**20
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_URL = re.compile(r"(?P<dialect>sqlite|postgresql)(?:\+[A-Za-z0-9_]+)?://(?P<rest>.*)", re.DOTALL)
_FROZEN = ConfigDict(extra="forbid", frozen=True)


class _Problem(ValueError):
    """A validation error that knows a finer key path than the field it was raised for."""

    def __init__(self, message: str, at: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.at = at


class _Unit:
    """Annotation marker: how example_toml() writes a default back ("duration", "size")."""

    def __init__(self, name: str) -> None:
        self.name = name


# ---- value checks: each returns the parsed value or raises ValueError with a one-line text ----


def _duration(value: Any) -> float:
    seconds = units.parse_duration(value)
    if seconds <= 0:
        expected = f"a duration above zero, {units.DURATION_EXPECTED}"
        raise ValueError(f"{value!r} is zero (expected {expected})")
    return seconds


def _size(value: Any) -> int:
    size = units.parse_size(value)
    if size <= 0:
        raise ValueError(f"{value!r} is zero (expected a size above zero, {units.SIZE_EXPECTED})")
    return size


def _fraction(value: Any) -> float:
    fraction = units.parse_percent(value)
    if fraction <= 0:
        raise ValueError(f"{value!r} is zero (expected {units.PERCENT_EXPECTED}, above zero)")
    return fraction


def _rate(value: Any) -> float:
    per_second = units.parse_rate(value)
    if per_second <= 0:
        raise ValueError(f"{value!r} is zero (expected a rate above zero, {units.RATE_EXPECTED})")
    return per_second


def _count(minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        expected = f"(expected an integer >= {minimum})"
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not an integer {expected}")
        if value < minimum:
            raise ValueError(f"{value!r} is too small {expected}")
        return value

    return check


def _at_most(check: Callable[[Any], int], maximum: int) -> Callable[[Any], int]:
    def bounded(value: Any) -> int:
        value = check(value)
        if value > maximum:
            raise ValueError(f"{value!r} is too large (expected an integer <= {maximum})")
        return value

    return bounded


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """TOML has no null: ``false`` switches an optional limit off."""
    return lambda value: None if value is None or value is False else check(value)


def _choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError(
                f"{value!r} is not allowed (expected {' or '.join(map(repr, options))})"
            )
        return value

    return check


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not a boolean (expected true or false)")
    return value


def _end_job_tree(value: Any) -> bool | None:
    return None if value is None else _flag(value)


def _text(pattern: str, expected: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise ValueError(f"{value!r} is not valid (expected {expected})")
        return value

    return check


def _handler(value: Any) -> str | CommandSpec:
    """Only the form: importing the handler is workers.handlers' job, before the fork. A
    table is a command handler (``_command``)."""
    if isinstance(value, CommandSpec):
        return value
    if isinstance(value, Mapping):
        return _command(value)
    module, _, function = value.partition(":") if isinstance(value, str) else ("", "", "")
    parts = [*module.split("."), function]
    if not all(part.isidentifier() for part in parts):
        expected = 'a "module:function" reference such as "app.jobs:reindex", or a table'
        expected += ' such as { command = ["pdftotext", "{path}", "-"] }'
        raise ValueError(f"{value!r} is not a handler (expected {expected})")
    return value


_COMMAND_KEYS = ["command", "stall_timeout", "permanent_codes", "env"]


def _command(table: Mapping[str, Any]) -> CommandSpec:
    """``{ command = [argv...], stall_timeout = "30s", permanent_codes = [2, 65],
    env = { NAME = "value" } }``."""
    for key in table:
        if key not in _COMMAND_KEYS:
            raise _Problem(_unknown_key(str(key), _COMMAND_KEYS), (key,))
    if "command" not in table:
        raise ValueError('a command handler without command (expected command = ["prog", ...])')
    argv = table["command"]
    if not isinstance(argv, list) or not argv:
        expected = 'a non-empty list of strings, e.g. ["pdftotext", "{path}", "-"]'
        raise _Problem(f"{argv!r} is not a command (expected {expected})", ("command",))
    for i, arg in enumerate(argv):
        if not isinstance(arg, str) or "\0" in arg or (i == 0 and not arg.strip()):
            what = "a program name" if i == 0 else "a string argument"
            raise _Problem(f"{arg!r} is not {what} (expected {what})", ("command", i))
    if placeholder_names(argv[0]):
        raise _Problem(
            f"{argv[0]!r} names the program from the payload (expected a fixed program)",
            ("command", 0),
        )
    stall = table.get("stall_timeout")
    try:
        stall = _optional(_duration)(stall)
    except ValueError as exc:
        raise _Problem(str(exc), ("stall_timeout",)) from None
    codes = table.get("permanent_codes", [])
    if not isinstance(codes, list):
        raise _Problem(f"{codes!r} is not a list (expected e.g. [2, 65])", ("permanent_codes",))
    for i, code in enumerate(codes):
        if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 255:
            message = f"{code!r} is not an exit code (expected an integer from 1 to 255)"
            raise _Problem(message, ("permanent_codes", i))
    env = table.get("env", {})
    if not isinstance(env, Mapping):
        raise _Problem(f'{env!r} is not a table (expected e.g. {{ LANG = "C.UTF-8" }})', ("env",))
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            message = f"{name!r} is not a variable name (expected letters, digits and _)"
            raise _Problem(message, ("env", name))
        if not isinstance(value, str) or "\0" in value:
            raise _Problem(f"{value!r} is not a string (expected a string)", ("env", name))
    return CommandSpec(tuple(argv), stall, frozenset(codes), tuple(sorted(env.items())))


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _kind_table(value: Any) -> Any:
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a table (expected {{ kind = ... }})")
    for kind in value:
        if not kind or any(c.isspace() or not c.isprintable() for c in kind):
            raise _Problem(f"{kind!r} is not a job kind (expected a name without spaces)", (kind,))
    return value


def _handler_table(value: Any) -> Any:
    if _kind_table(value) == {}:
        raise ValueError('no handlers (expected { kind = "module:function", ... })')
    return value


def _address(value: Any) -> str:
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host.strip("[]") or not port.isdigit() or int(port) > 65535:
        raise ValueError(f'{value!r} is not a host:port address (expected e.g. "127.0.0.1:9464")')
    return value


Duration = Annotated[float, BeforeValidator(_duration), _Unit("duration")]
Size = Annotated[int, BeforeValidator(_size), _Unit("size")]
OptSize = Annotated[int | None, BeforeValidator(_optional(_size)), _Unit("size")]
Count = Annotated[int, BeforeValidator(_count(0))]
Positive = Annotated[int, BeforeValidator(_count(1))]
OptPositive = Annotated[int | None, BeforeValidator(_optional(_count(1)))]
Name = Annotated[str | None, BeforeValidator(_optional(_text(r"\S+", "a name")))]
Handlers = Annotated[
    dict[str, Annotated[str | CommandSpec, BeforeValidator(_handler)]],
    BeforeValidator(_handler_table),
]
KindCaps = Annotated[dict[str, Positive], BeforeValidator(_kind_table)]
OptRate = Annotated[float | None, BeforeValidator(_optional(_rate)), _Unit("rate")]
KindRates = Annotated[
    dict[str, Annotated[float, BeforeValidator(_rate)]], BeforeValidator(_kind_table)
]


# A weight's bounds: the fair order divides a slot by the weight (fair.slot_key), which for a
# weight as small as 1e-310 overflows and fails every claim of the pool; beyond a million to
# one (either way) a share means nothing a pool of a few hundred slots could show.
WEIGHT_MIN, WEIGHT_MAX = 0.001, 1_000_000


def _weight(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{value!r} is not a weight (expected a number above zero, e.g. 3)")
    if value == float("inf"):
        raise ValueError(f"{value!r} is not a weight (expected a finite number, e.g. 3)")
    if not WEIGHT_MIN <= value <= WEIGHT_MAX:
        expected = f"from {WEIGHT_MIN:g} to {WEIGHT_MAX:,}, e.g. 3"
        raise ValueError(f"{value!r} is out of range for a weight (expected {expected})")
    return float(value)


def _weight_table(value: Any) -> Any:
    """``{ tenant = weight }``: tenants as enqueue takes them (``""`` is jobs without one)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a table (expected {{ tenant = weight, ... }})")
    for tenant, weight in value.items():
        if len(tenant) > NAME_MAX or any(c.isspace() or not c.isprintable() for c in tenant):
            message = f"{tenant!r} is not a tenant (expected a name without spaces)"
            raise _Problem(message, (tenant,))
        try:
            _weight(weight)
        except ValueError as exc:
            raise _Problem(str(exc), (tenant,)) from None
    return value


TenantWeights = Annotated[
    dict[str, Annotated[float, BeforeValidator(_weight)]], BeforeValidator(_weight_table)
]


def _key(default: Any, about: str, *, example: Any = None, derived: str = "", **kw: Any) -> Any:
    """A documented key: ``about`` and ``example`` feed example_toml(); ``derived`` says what a
    computed default stands for (it is then shown commented out, with ``example``)."""
    examples = None if example is None else [example]
    extra = {"derived": derived} if derived else None
    return Field(default, description=about, examples=examples, json_schema_extra=extra, **kw)


def _shape(**kw: Any) -> Any:
    """A field filled from the file's shape (its path, the [pools.NAME] tables), not a key."""
    return Field(json_schema_extra={"shape": True}, **kw)


class MemoryBudget(BaseModel):
    """RSS this host's workers may use, all pools together: a fraction of the host's memory (or of
    the container's limit) or an absolute number of bytes. Exactly one of the two is set."""

    model_config = _FROZEN
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
            return cls(fraction=_fraction(value))
        try:
            return cls(size=_size(value))
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


class PoolConfig(BaseModel):
    """One ``[pools.NAME]`` table: the kinds the pool runs, its workers, and the limits that keep
    a hostile job from taking the pool down. Durations are seconds, sizes are bytes.

    To add a key: declare a field with a default and a one-line description (example_toml()
    documents it), and a field validator when it depends on another key declared above it."""

    model_config = _FROZEN

    name: Annotated[str, BeforeValidator(_text(_IDENTIFIER.pattern, "a pool name"))] = _shape()
    handlers: Handlers = _key(
        ...,
        'job kind = "module:function", or = { command = [argv...] }; each kind in exactly one pool',
    )
    min_workers: Count = _key(1, "workers kept running even when the pool is idle")
    max_workers: Positive = _key(4, "at most this many workers on this host")
    bound: Annotated[str, BeforeValidator(_choice("cpu", "io"))] = _key(
        "cpu", '"cpu": each worker counts against the cores; "io": it does not'
    )
    memory_limit: OptSize = _key(
        512 * _MiB, "a worker whose RSS passes this in a job is stopped; false: no limit"
    )
    job_memory: Size = _key(200 * _MiB, "expected peak RSS of one job, for sizing until measured")
    timeout: Duration = _key(60.0, "wall-clock limit per job (error_kind timeout)")
    soft_timeout: Annotated[float, BeforeValidator(units.parse_duration), _Unit("duration")] = _key(
        0.0, "past timeout, raise SoftTimeout in the handler this long before SIGKILL; 0: none"
    )
    lease: Duration = _key(60.0, "how long a claim holds a job before it must be extended")
    # The 20s default stands for lease / 3, which _default_heartbeat fills in.
    heartbeat: Duration = _key(
        20.0, "how often leases are extended; below lease", example="20s", derived="lease / 3"
    )
    max_lease_extensions: Count = _key(30, "a job whose lease needs more is stopped (timeout)")
    max_deliveries: Positive = _key(3, "deliveries before a job is dead-lettered")
    retry_backoff: Duration = _key(1.0, "first retry delay; doubles, with full jitter")
    retry_backoff_max: Duration = _key(600.0, "the longest retry delay")
    retry_budget: Annotated[float | None, BeforeValidator(_optional(_fraction))] = _key(
        None, "retries may be at most this share of the pool's deliveries", example="10%"
    )
    latency_target: Duration = _key(300.0, "backlog-age objective: the oldest job's age to keep")
    utilization: Annotated[float, BeforeValidator(_fraction)] = _key(
        0.7, "planned busy share of a worker when sizing the pool (queues explode near 100%)"
    )
    scale_in_cooldown: Duration = _key(
        60.0, "scale in only after the pool wanted fewer workers for this long"
    )
    max_inflight: OptPositive = _key(
        None, "fleet-wide cap on this pool's running jobs, all hosts together", example=50
    )
    tenant_max_inflight: OptPositive = _key(
        None, "fleet-wide cap on one tenant's running jobs in this pool", example=10
    )
    kind_max_inflight: KindCaps = Field(
        default_factory=dict,
        description="fleet-wide cap per kind of this pool, e.g. { render = 5 }",
    )
    # ---- fair share between tenants (supervisor/store/fair.py) ----
    fair: Annotated[bool, BeforeValidator(_flag)] = _key(
        True,
        "claim fairly between the tenants of queued jobs; false: strict priority, then FIFO "
        "(a pool with caps always claims fairly)",
    )
    tenant_weights: TenantWeights = Field(
        default_factory=dict,
        description="a tenant's share of the pool against others' (default 1; 0.001 to 1,000,000)",
    )
    # ---- end of fair share ----
    max_jobs_per_worker: OptPositive = _key(
        10_000, "a worker is replaced after this many jobs; false: never"
    )
    recycle_rss: OptSize = _key(
        None,
        "a worker whose RSS stays above this after a job is replaced (so is one near memory_limit)",
        example="400MiB",
    )
    prefetch: Count = _key(0, "jobs claimed ahead of idle workers (each holds a lease meanwhile)")
    pipeline: Positive = _key(
        64, "most jobs sent to one worker at once while the pool's jobs are sub-millisecond; 1: off"
    )
    user: Name = _key(
        None, "run workers as this user (fleetd must start as root)", example="fleetd"
    )
    group: Name = _key(None, "run workers with this group", example="fleetd")
    nproc_limit: OptPositive = _key(
        None, "RLIMIT_NPROC for workers: fork bombs stop there", example=256
    )
    private_shm: Annotated[bool, BeforeValidator(_flag)] = _key(
        True,
        "each worker its own /dev/shm (at most memory_limit), emptied after every job; root only",
    )
    end_job_tree: Annotated[bool | None, BeforeValidator(_end_job_tree)] = _key(
        None,
        "kill every process a job left when it ends (Python handlers' helpers kept across jobs "
        "too: a process pool, multiprocessing's resource tracker)",
        example=True,
        derived="true when the pool has a command handler, else false",
    )
    # ---- rate limits: the downstream's own unit (supervisor/rates.py, store/rated.py) ----
    rate_limit: OptRate = _key(
        None,
        'fleet-wide starts of this pool\'s jobs, all hosts together: "50/s", "600/m", "1000/h"',
        example="50/s",
    )
    kind_rate_limit: KindRates = Field(
        default_factory=dict,
        description='fleet-wide starts per kind of this pool, e.g. { enrich = "10/s" }',
    )
    rate_burst: OptPositive = _key(
        None,
        "jobs rate_limit lets start at once after a quiet spell (a kind's: one second of its rate)",
        example=50,
        derived="one second of rate_limit, at least 1",
    )

    # ---- slots: several jobs at once per worker (io pools; workers/slots.py) ----
    slots: Positive = _key(
        1,
        "jobs one worker runs at once, each in a thread (io pools only; a deadline, cancel or "
        "memory kill of one ends the worker, and its other jobs are released)",
    )

    @model_validator(mode="after")
    def _slots_fit(self) -> PoolConfig:
        # A thread cannot be killed, and a command's runner kills every process of the
        # worker when its job ends (workers.tree.end_all): both need one job per worker.
        if self.slots > 1 and self.bound != "io":
            raise _Problem(
                f'{self.slots} needs bound = "io" (a cpu pool runs one job per worker)',
                ("slots",),
            )
        if self.slots > 1 and self.soft_timeout > 0:
            raise _Problem(
                f"{self.slots} cannot raise SoftTimeout in a slot's thread (a signal reaches "
                "only a worker's main thread): set soft_timeout = 0 (expected 1)",
                ("slots",),
            )
        if self.slots > 1 and self.nproc_limit is not None and self.nproc_limit <= self.slots + 1:
            # RLIMIT_NPROC counts threads: a slot's thread could not start
            raise _Problem(
                f"{self.slots} threads do not fit nproc_limit {self.nproc_limit} (it counts "
                f"threads: the worker needs at least {self.slots + 2})",
                ("slots",),
            )
        commands = [k for k, h in self.handlers.items() if isinstance(h, CommandSpec)]
        if self.slots > 1 and commands:
            raise _Problem(
                f"{self.slots} cannot run command handlers ({', '.join(commands)}): a "
                "command's end kills every process of its worker (expected 1)",
                ("slots",),
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_heartbeat(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("heartbeat") is None:
            try:
                lease = _duration(data.get("lease", 60.0))
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
        _fair_keys(self)
        for kind in self.kind_max_inflight:
            if kind not in self.handlers:
                known = ", ".join(map(repr, self.handlers))
                message = f"{kind!r} is not a kind of this pool (expected one of {known})"
                raise _Problem(message, ("kind_max_inflight", kind))
        return self

    @model_validator(mode="after")
    def _rates_consistent(self) -> PoolConfig:
        for kind in self.kind_rate_limit:
            if kind not in self.handlers:
                known = ", ".join(map(repr, self.handlers))
                message = f"{kind!r} is not a kind of this pool (expected one of {known})"
                raise _Problem(message, ("kind_rate_limit", kind))
        if self.rate_burst is not None and self.rate_limit is None:
            message = f"{self.rate_burst!r} is set without a rate (expected rate_limit too)"
            raise _Problem(message, ("rate_burst",))
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


def _fair_keys(pool: PoolConfig) -> None:
    """``fair = false`` with a cap, or with ``tenant_weights``, would be a key without effect:
    a capped claim always orders fairly (fair.py), and weights are the fair order's."""
    if pool.fair:
        return
    caps = ("max_inflight", "tenant_max_inflight", "kind_max_inflight")
    cap = next((k for k in caps if getattr(pool, k)), None)
    if cap is not None:
        message = f"false with {cap} set (expected true: a pool with caps always claims fairly)"
        raise _Problem(message, ("fair",))
    if pool.tenant_weights:
        message = "false with tenant_weights set (expected true: weights order the fair claim)"
        raise _Problem(message, ("fair",))


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
        raise _Problem(f"{show(b)!r} {too_low} {low} {show(a)!r} {expected}", (high,))
    raise _Problem(f"{show(a)!r} {too_high} {high} {show(b)!r} {expected}", (low,))


# ---- schedules: [schedules.NAME] ----


def _payload(value: Any) -> str:
    """A schedule's payload table as JSON text (TOML dates are not JSON: an error here)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a table (expected e.g. {{ full = true }})")
    if "scheduled_for" in value:
        raise _Problem(
            "'scheduled_for' is set by fleetd to each tick's time (expected another key)",
            ("scheduled_for",),
        )
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{value!r} is not JSON (expected strings, numbers, tables: {exc})"
        ) from None


def _priority(value: Any) -> int:
    expected = f"an integer from {PRIORITY_MIN} to {PRIORITY_MAX}; higher runs first"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer (expected {expected})")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(f"{value!r} is out of range (expected {expected})")
    return value


def _short(check: Callable[[Any], Any], what: str) -> Callable[[Any], Any]:
    """``check``, then at most ``NAME_MAX`` characters (what the database's column holds)."""

    def bounded(value: Any) -> Any:
        value = check(value)
        if isinstance(value, str) and len(value) > NAME_MAX:
            raise ValueError(
                f"{value[:20]!r}... is {len(value)} characters long "
                f"(expected {what} of at most {NAME_MAX})"
            )
        return value

    return bounded


class ScheduleConfig(BaseModel):
    """One ``[schedules.NAME]`` table: a periodic job, enqueued once per tick by whichever
    supervisor comes first (supervisor/schedules.py decides which ticks)."""

    model_config = _FROZEN

    name: Annotated[str, BeforeValidator(_text(_IDENTIFIER.pattern, "a schedule name"))] = _shape()
    kind: Annotated[str, BeforeValidator(_text(r"\S+", "a job kind"))] = _key(
        ..., "the job kind each tick enqueues (a kind of some pool of this file)", example="reindex"
    )
    cron: Annotated[
        str | None, BeforeValidator(_optional(_text(r".*\S.*", "a cron expression")))
    ] = _key(None, "a cron expression (five fields; six with seconds first)", example="0 2 * * *")
    every: Annotated[float | None, BeforeValidator(_optional(_duration)), _Unit("duration")] = _key(
        None, "or: a period, ticking at its multiples since the Unix epoch (UTC)", example="5m"
    )
    timezone: Annotated[str, BeforeValidator(_text(r"\S+", "a time zone name"))] = _key(
        "UTC", "the cron expression's time zone (IANA name; DST as the cron library defines it)"
    )
    payload: Annotated[str, BeforeValidator(_payload)] = _key(
        "{}", 'the job\'s payload; each tick adds "scheduled_for" (the tick time, ISO 8601 UTC)'
    )
    catch_up: Annotated[str, BeforeValidator(_choice(*schedules.CATCH_UP))] = _key(
        "once",
        'after downtime: "skip" (none), "once" (the latest missed tick), "all" (each, capped)',
    )
    catch_up_max: Annotated[int, BeforeValidator(_at_most(_count(1), schedules.CATCH_UP_MAX))] = (
        _key(10, 'at most this many missed ticks with catch_up = "all" (1 to 1000)')
    )
    overlap: Annotated[str, BeforeValidator(_choice(*schedules.OVERLAP))] = _key(
        "skip", '"skip": no new tick while the last one is queued or running; "allow": enqueue'
    )
    tenant: Annotated[
        str | None, BeforeValidator(_optional(_short(_text(r"\S+", "a name"), "a tenant")))
    ] = _key(None, "the jobs' tenant, as for enqueue", example="acme")
    priority: Annotated[int, BeforeValidator(_priority)] = _key(0, "the jobs' priority")

    @model_validator(mode="after")
    def _timing(self) -> ScheduleConfig:
        if self.cron is not None and self.every is not None:
            raise _Problem("both cron and every are set (expected exactly one)", ("every",))
        if self.cron is None and self.every is None:
            raise ValueError(
                'neither cron nor every is set (expected cron = "0 2 * * *" or every = "5m")'
            )
        if self.every is not None and self.timezone != "UTC":
            raise _Problem(
                f"{self.timezone!r} with every (expected a cron schedule: every ticks on the "
                "Unix epoch's multiples, in no time zone)",
                ("timezone",),
            )
        at = "cron" if self.cron is not None else "every"
        try:
            self.timing()
        except ValueError as exc:
            where = ("timezone",) if "time zone" in str(exc) else (at,)
            raise _Problem(str(exc), where) from None
        return self

    def timing(self) -> schedules.Timing:
        return schedules.Timing.of(self.cron, self.every, self.timezone)


def _named_schedule(name: Any, table: Any) -> Any:
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        expected = f"a schedule name matching {_IDENTIFIER.pattern}"
        raise _Problem(f"{name!r} is not a schedule name (expected {expected})", (name,))
    try:
        _short(str, "a schedule name")(name)
    except ValueError as exc:  # the key path would repeat the long name: the message has it
        raise _Problem(str(exc)) from None
    if isinstance(table, ScheduleConfig) and table.name == name:
        return table
    if not isinstance(table, Mapping):
        raise _Problem(f"{table!r} is not a table (expected a [schedules.{name}] table)", (name,))
    if "name" in table:
        raise _Problem(_unknown_key("name", _keys(ScheduleConfig)), (name, "name"))
    return {**table, "name": name}


# ---- the fleet: [fleet] keys plus the pools ----


def _environ(info: ValidationInfo) -> Mapping[str, str]:
    environ = (info.context or {}).get("environ")
    return os.environ if environ is None else environ


def _folder(info: ValidationInfo) -> Path:
    """Relative paths in the file resolve against the file's folder, not the working directory:
    systemd and Kubernetes start fleetd from wherever they like."""
    path = info.data.get("path")
    return path.parent if path is not None else Path(os.path.abspath("."))


def _under(folder: Path, path: str | Path) -> Path:
    # abspath, not resolve(): it normalises ".." without following symlinks, so a deploy's
    # "current -> releases/42" stays as the operator wrote it.
    return Path(os.path.abspath(folder / path))


def _expand(raw: str, environ: Mapping[str, str]) -> str:
    def lookup(match: re.Match[str]) -> str:
        name = match[1]
        if name not in environ:
            message = f"{raw!r} uses the environment variable {name}, which is not set"
            raise ValueError(f"{message} (expected {name} in the environment)")
        return environ[name]

    return _ENV_VAR.sub(lookup, raw)


def _database_url(raw: Any, folder: Path, environ: Mapping[str, str]) -> str:
    """Expand ``${VAR}``, check the dialect, make a relative SQLite path absolute. Messages show
    the value as typed, never the expanded one: it may carry a password."""
    expected = 'a SQLAlchemy URL such as "sqlite:///fleetd.db" or "postgresql://host/db"'
    if not isinstance(raw, str):
        raise ValueError(f"{raw!r} is not a database URL (expected {expected})")
    url = _expand(raw, environ)
    match = _URL.fullmatch(url)
    if match is None:
        expanded = " once expanded" if url != raw else ""
        raise ValueError(f"{raw!r} is not a database URL{expanded} (expected {expected})")
    if match["dialect"] != "sqlite":
        return url
    return _sqlite_url(raw, url[: url.index("://")], match["rest"], folder)


def _sqlite_url(raw: str, scheme: str, rest: str, folder: Path) -> str:
    # "sqlite:///x.db" leaves rest "/x.db" (relative); "sqlite:////abs/x.db" leaves "//abs/x.db".
    file, query = rest[1:].partition("?")[::2] if rest.startswith("/") else ("", "")
    if file in ("", ":memory:") or "mode=memory" in query:
        expected = 'a file, e.g. "sqlite:///fleetd.db": every fleetd process must share it'
        raise ValueError(f"{raw!r} is not a database file (expected {expected})")
    if not file.startswith("file:"):  # URI filenames are passed through as written
        file = str(_under(folder, file))
    return f"{scheme}:///{file}" + (f"?{query}" if query else "")


def _python_path(value: Any, folder: Path) -> tuple[Path, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f'{value!r} is not a list of folders (expected e.g. [".", "src"])')
    for index, entry in enumerate(value):
        if not isinstance(entry, str | Path) or not str(entry):
            raise _Problem(f"{entry!r} is not a folder (expected a path string)", (index,))
    return tuple(_under(folder, entry) for entry in value)


def _named_pool(name: Any, table: Any) -> Any:
    """A pool table with its name filled in from ``[pools.NAME]``."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        expected = f"a pool name matching {_IDENTIFIER.pattern}"
        raise _Problem(f"{name!r} is not a pool name (expected {expected})", (name,))
    if isinstance(table, PoolConfig) and table.name == name:
        return table
    if not isinstance(table, Mapping):
        raise _Problem(f"{table!r} is not a table (expected a [pools.{name}] table)", (name,))
    if "name" in table:  # the table's own name: typing it again could only disagree
        raise _Problem(_unknown_key("name", _keys(PoolConfig)), (name, "name"))
    return {**table, "name": name}


class FleetConfig(BaseModel):
    """A validated fleet.toml: the ``[fleet]`` keys and the pools, in the file's order. Paths are
    absolute and the database URL fully resolved, so nothing depends on the working directory."""

    model_config = _FROZEN

    path: Annotated[Path, AfterValidator(lambda p: Path(os.path.abspath(p)))] = _shape()
    name: Annotated[str, BeforeValidator(_text(r"[A-Za-z0-9_.-]+", "letters, digits, _.-"))] = _key(
        ...,
        "the fleet's name in logs, metrics and status",
        example="fleet",
        derived="the file's name",
    )
    database: str = _key(
        "sqlite:///fleetd.db",
        'SQLAlchemy URL; SQLite paths are relative to this file; "${VAR}" reads the environment',
        validate_default=True,
    )
    python_path: tuple[Path, ...] = _key(
        (".",),
        "folders put on sys.path to import handlers, relative to this file",
        validate_default=True,
    )
    grace_period: Duration = _key(30.0, "on SIGTERM or SIGINT, how long running jobs may finish")
    metrics: Annotated[str | None, BeforeValidator(_optional(_address))] = _key(
        None, '"host:port" serving /metrics and /healthz', example="127.0.0.1:9464"
    )
    memory_budget: Annotated[MemoryBudget, BeforeValidator(MemoryBudget.parse)] = _key(
        MemoryBudget(fraction=0.8), "RSS all workers here may use: a share of memory, or a size"
    )
    memory_cgroup: Annotated[bool, BeforeValidator(_flag)] = _key(
        True,
        "a cgroup per worker at memory_limit + 128MiB where the host allows it (fleetd check)",
    )
    retention: Duration = _key(7 * 86400.0, "done jobs are pruned after this long")
    scale_interval: Duration = _key(2.0, "how often each pool's size is re-evaluated")
    log_format: Annotated[str, BeforeValidator(_choice("human", "json"))] = _key(
        "human", '"human", or "json" for one JSON object a line'
    )
    pools: Mapping[str, PoolConfig] = _shape(default_factory=dict, validate_default=True)
    schedules: Mapping[str, ScheduleConfig] = _shape(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "name" not in data and data.get("path") is not None:
            return {**data, "name": Path(data["path"]).stem}
        return data

    @field_validator("database", mode="before")
    @classmethod
    def _resolve_database(cls, value: Any, info: ValidationInfo) -> str:
        return _database_url(value, _folder(info), _environ(info))

    @field_validator("python_path", mode="before")
    @classmethod
    def _resolve_python_path(cls, value: Any, info: ValidationInfo) -> tuple[Path, ...]:
        return _python_path(value, _folder(info))

    @field_validator("pools", mode="before")
    @classmethod
    def _name_pools(cls, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError(f"{value!r} is not a table (expected [pools.NAME] tables)")
        if not value:
            raise ValueError("no pools (expected at least one [pools.NAME] table with handlers)")
        return {name: _named_pool(name, table) for name, table in value.items()}

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
                    raise _Problem(message, (pool.name, "handlers", kind))
                owner[kind] = pool.name
        return pools

    @field_validator("schedules", mode="before")
    @classmethod
    def _name_schedules(cls, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError(f"{value!r} is not a table (expected [schedules.NAME] tables)")
        return {name: _named_schedule(name, table) for name, table in value.items()}

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
                raise _Problem(message, (name, "kind"))
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


# ---- loading, and turning every failure into one line ----


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> FleetConfig:
    """Read and validate a fleet.toml. ``environ`` (default ``os.environ``) supplies ``${VAR}``
    in the database URL. Any problem raises a one-line ConfigError naming file and key."""
    label = str(path)
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(label, "", "no such file (expected the path of a fleet.toml)") from None
    except OSError as exc:
        raise ConfigError(label, "", f"cannot be read: {exc.strerror} (expected a file)") from None
    except UnicodeDecodeError:
        raise ConfigError(label, "", "is not UTF-8 text (expected a TOML file)") from None
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(label, exc) from None
    return _build(data, Path(path), label, environ)


def parse_config(
    text: str, path: str | Path, environ: Mapping[str, str] | None = None
) -> FleetConfig:
    """As load_config, from TOML text; ``path`` names the file for relative paths and errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(str(path), exc) from None
    return _build(data, Path(path), str(path), environ)


def _toml_error(label: str, exc: tomllib.TOMLDecodeError) -> ConfigError:
    # tomllib says e.g. "Invalid value (at line 3, column 10)"; keep it, moved to the front.
    text = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", text)
    where = f"line {match[1]}, column {match[2]}" if match else ""
    what = text[: match.start()] if match else text.replace(" (at end of document)", "")
    return ConfigError(label, where, f"invalid TOML: {what[:1].lower()}{what[1:]}")


def _build(
    data: dict[str, Any], path: Path, label: str, environ: Mapping[str, str] | None
) -> FleetConfig:
    for key in data:
        if key not in ("fleet", "pools", "schedules"):
            known = ["fleet", "pools", "schedules"]
            raise ConfigError(label, _key_path([key]), _unknown_key(key, known))
    fleet = data.get("fleet", {})
    if not isinstance(fleet, dict):
        raise ConfigError(label, "fleet", f"{fleet!r} is not a table (expected a [fleet] table)")
    for key in fleet:
        if key not in _keys(FleetConfig):
            raise ConfigError(
                label, _key_path(["fleet", key]), _unknown_key(key, _keys(FleetConfig))
            )
    fields = {**fleet, "path": path, "pools": data.get("pools", {})}
    if "schedules" in data:
        fields["schedules"] = data["schedules"]
    try:
        return FleetConfig.model_validate(fields, context={"environ": environ})
    except ValidationError as exc:
        raise _translate(label, exc) from None


def _translate(label: str, exc: ValidationError) -> ConfigError:
    """The first of pydantic's errors as one ConfigError line; its loc becomes the key path as
    the user would write it (``pools.bulk.timeout``, ``fleet.database``)."""
    error = exc.errors(include_url=False)[0]
    loc: list[str | int] = list(error["loc"])
    tables = {"pools": PoolConfig, "schedules": ScheduleConfig}
    model: type[BaseModel] = tables.get(str(loc[0]) if loc else "", FleetConfig)
    if error["type"] == "value_error":
        problem = error["ctx"]["error"]
        loc += getattr(problem, "at", ())
        message = str(problem)
    elif error["type"] == "extra_forbidden":
        message = _unknown_key(str(loc[-1]), _keys(model))
    elif error["type"] == "missing":
        field = model.model_fields.get(str(loc[-1]))
        about = field.description if field is not None else "a value"
        message = f"missing (expected {about})"
    else:  # a shape our validators do not check first; pydantic's msg is short and URL-free
        message = f"{error['input']!r} is not valid: {error['msg']}"
    key = _key_path(loc if str(loc[0] if loc else "") in tables else ["fleet", *loc])
    return ConfigError(label, key, " ".join(message.split()))


def _key_path(parts: list[str | int]) -> str:
    """``["pools", "bulk", "handlers", "pdf.render"]`` -> ``pools.bulk.handlers."pdf.render"``."""
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            segment = part if _BARE_KEY.fullmatch(part) else json.dumps(part)
            path += f".{segment}" if path else segment
    return path


def _keys(model: type[BaseModel]) -> list[str]:
    """The keys a user may type for ``model``, in schema order."""
    return [name for name, field in model.model_fields.items() if not _meta(field).get("shape")]


def _unknown_key(key: str, known: list[str]) -> str:
    # difflib catches typos ("memry_limit"); the substring test catches a short form ("grace").
    close = difflib.get_close_matches(key, known, n=1) or [k for k in known if key in k][:1]
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({hint}known: {', '.join(known)})"


def _meta(field: Any) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


# ---- the documented example, rendered from the schema ----

_HEADER = [
    "# fleetd configuration: every key, with its default and what it does.",
    '# Durations are "250ms", "30s", "5m", "1h", "7d" or a number of seconds; sizes are "512MiB",',
    '# "2GiB", "500MB" or a number of bytes. Keys commented out have no default or a computed one;',
    "# false switches an optional limit off. Generated by supervisor.config.example_toml().",
    "",
]
_EXAMPLE_POOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "bulk": (
        "Heavy batch work. This table shows every pool key with its default.",
        {"handlers": {"reindex": "app.jobs:reindex", "render": "app.pdf:render"}},
    ),
    "interactive": (
        "Short jobs someone waits for, mostly waiting on other services.",
        {
            "handlers": {"thumbnail": "app.images:thumbnail", "enrich": "app.enrich:call_api"},
            **{"bound": "io", "min_workers": 2, "max_workers": 8, "timeout": "10s"},
            **{"lease": "30s", "latency_target": "5s", "retry_backoff_max": "30s"},
            **{"slots": 10, "job_memory": "20MiB"},
            **{"max_inflight": 50, "tenant_max_inflight": 10, "kind_max_inflight": {"enrich": 20}},
            **{"rate_limit": "50/s", "kind_rate_limit": {"enrich": "10/s"}},
            **{"tenant_weights": {"acme": 3}},
        },
    ),
    "poison": (
        "Untrusted input that may hang, leak or bomb: tight limits, one delivery, fresh workers.",
        {
            "handlers": {
                "parse_upload": "app.uploads:parse",
                "pdf_text": {
                    "command": ["pdftotext", "-layout", "{path}", "-"],
                    "stall_timeout": "30s",
                    "permanent_codes": [1, 3],
                },
            },
            **{"max_workers": 2, "memory_limit": "256MiB", "job_memory": "128MiB"},
            **{"timeout": "10s", "soft_timeout": "2s", "max_deliveries": 1},
            **{"max_jobs_per_worker": 1, "nproc_limit": 64},
        },
    ),
}


_EXAMPLE_SCHEDULE: tuple[str, dict[str, Any]] = (
    "A periodic job, enqueued once per tick by whichever supervisor comes first.",
    {"kind": "reindex", "cron": "0 2 * * *", "timezone": "Europe/Paris", "payload": {"full": True}},
)


def example_toml() -> str:
    """conf/fleet.example.toml: every key with its default and a one-line comment, from the
    schema, and three example pools (bulk documents every key; the others show overrides)."""
    lines = [*_HEADER, "[fleet]", *_documented(FleetConfig, {})]
    for name, (about, values) in _EXAMPLE_POOLS.items():
        lines += ["", f"# {about}", f"[pools.{name}]"]
        lines += _documented(PoolConfig, values) if name == "bulk" else _overrides(values)
    lines += ["", f"# {_EXAMPLE_SCHEDULE[0]}", "[schedules.nightly_reindex]"]
    lines += _documented(ScheduleConfig, _EXAMPLE_SCHEDULE[1])
    return "\n".join(lines) + "\n"


def _documented(model: type[BaseModel], values: dict[str, Any]) -> list[str]:
    lines = []
    for key in _keys(model):
        field = model.model_fields[key]
        meta = _meta(field)
        derived = f"; default {meta['derived']}" if "derived" in meta else ""
        lines.append(f"# {field.description}{derived}")
        if key in values:
            lines.append(f"{key} = {_literal(values[key])}")
        elif "derived" in meta or field.get_default(call_default_factory=True) is None:
            lines.append(f"# {key} = {_literal(field.examples[0])}")
        else:
            lines.append(f"{key} = {_default(field)}")
    return lines


def _overrides(values: dict[str, Any]) -> list[str]:
    lines = []
    for key, value in values.items():
        field = PoolConfig.model_fields[key]
        line = f"{key} = {_literal(value)}"
        if not field.is_required():
            line += f"  # default {_meta(field).get('derived') or _default(field)}"
        lines.append(line)
    return lines


def _default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    unit = next((m.name for m in field.metadata if isinstance(m, _Unit)), "")
    if unit == "duration":
        value = units.format_duration(value)
    elif unit == "size":
        value = units.format_size(value)
    elif unit == "rate":
        value = units.format_rate(value)
    return _literal(value)


def _literal(value: Any) -> str:
    """A TOML literal for ``value``; json.dumps quoting is valid TOML for basic strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | MemoryBudget | Path):
        return json.dumps(str(value))
    if isinstance(value, Mapping):
        items = ", ".join(f"{_key_path([k])} = {_literal(v)}" for k, v in value.items())
        return f"{{ {items} }}" if items else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {value!r}")
