"""One ``[schedules.NAME]`` table -> a frozen ``ScheduleConfig``: a periodic job's kind, timing
(cron or every), payload and policies. Which ticks run is supervisor/schedules.py's business.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, model_validator

from supervisor import schedules
from supervisor.config.keys import FROZEN, IDENTIFIER, key, keys_of, shape, unknown_key
from supervisor.config.values import (
    Problem,
    Unit,
    at_most,
    check_duration,
    choice,
    count_from,
    matching,
    optional,
)
from supervisor.model import NAME_MAX, PRIORITY_MAX, PRIORITY_MIN


def _payload(value: Any) -> str:
    """A schedule's payload table as JSON text (TOML dates are not JSON: an error here)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a table (expected e.g. {{ full = true }})")
    if "scheduled_for" in value:
        raise Problem(
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

    model_config = FROZEN

    name: Annotated[str, BeforeValidator(matching(IDENTIFIER.pattern, "a schedule name"))] = shape()
    kind: Annotated[str, BeforeValidator(matching(r"\S+", "a job kind"))] = key(
        ..., "the job kind each tick enqueues (a kind of some pool of this file)", example="reindex"
    )
    cron: Annotated[
        str | None, BeforeValidator(optional(matching(r".*\S.*", "a cron expression")))
    ] = key(None, "a cron expression (five fields; six with seconds first)", example="0 2 * * *")
    every: Annotated[float | None, BeforeValidator(optional(check_duration)), Unit("duration")] = (
        key(None, "or: a period, ticking at its multiples since the Unix epoch (UTC)", example="5m")
    )
    timezone: Annotated[str, BeforeValidator(matching(r"\S+", "a time zone name"))] = key(
        "UTC", "the cron expression's time zone (IANA name; DST as the cron library defines it)"
    )
    payload: Annotated[str, BeforeValidator(_payload)] = key(
        "{}", 'the job\'s payload; each tick adds "scheduled_for" (the tick time, ISO 8601 UTC)'
    )
    catch_up: Annotated[str, BeforeValidator(choice(*schedules.CATCH_UP))] = key(
        "once",
        'after downtime: "skip" (none), "once" (the latest missed tick), "all" (each, capped)',
    )
    catch_up_max: Annotated[
        int, BeforeValidator(at_most(count_from(1), schedules.CATCH_UP_MAX))
    ] = key(10, 'at most this many missed ticks with catch_up = "all" (1 to 1000)')
    overlap: Annotated[str, BeforeValidator(choice(*schedules.OVERLAP))] = key(
        "skip", '"skip": no new tick while the last one is queued or running; "allow": enqueue'
    )
    tenant: Annotated[
        str | None, BeforeValidator(optional(_short(matching(r"\S+", "a name"), "a tenant")))
    ] = key(None, "the jobs' tenant, as for enqueue", example="acme")
    priority: Annotated[int, BeforeValidator(_priority)] = key(0, "the jobs' priority")

    @model_validator(mode="after")
    def _timing(self) -> ScheduleConfig:
        if self.cron is not None and self.every is not None:
            raise Problem("both cron and every are set (expected exactly one)", ("every",))
        if self.cron is None and self.every is None:
            raise ValueError(
                'neither cron nor every is set (expected cron = "0 2 * * *" or every = "5m")'
            )
        if self.every is not None and self.timezone != "UTC":
            raise Problem(
                f"{self.timezone!r} with every (expected a cron schedule: every ticks on the "
                "Unix epoch's multiples, in no time zone)",
                ("timezone",),
            )
        at = "cron" if self.cron is not None else "every"
        try:
            self.timing()
        except ValueError as exc:
            where = ("timezone",) if "time zone" in str(exc) else (at,)
            raise Problem(str(exc), where) from None
        return self

    def timing(self) -> schedules.Timing:
        return schedules.Timing.of(self.cron, self.every, self.timezone)


def named_schedule(name: Any, table: Any) -> Any:
    """A schedule table with its name filled in from ``[schedules.NAME]``."""
    if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
        expected = f"a schedule name matching {IDENTIFIER.pattern}"
        raise Problem(f"{name!r} is not a schedule name (expected {expected})", (name,))
    try:
        _short(str, "a schedule name")(name)
    except ValueError as exc:  # the key path would repeat the long name: the message has it
        raise Problem(str(exc)) from None
    if isinstance(table, ScheduleConfig) and table.name == name:
        return table
    if not isinstance(table, Mapping):
        raise Problem(f"{table!r} is not a table (expected a [schedules.{name}] table)", (name,))
    if "name" in table:
        raise Problem(unknown_key("name", keys_of(ScheduleConfig)), (name, "name"))
    return {**table, "name": name}
