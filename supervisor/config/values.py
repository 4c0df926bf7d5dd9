"""The checks behind every config value, and the annotated field types made of them.

Each check returns the parsed value or raises ValueError with a one-line text, which
supervisor.config turns into a ConfigError naming file and key. Values go through
``supervisor.units``, so "250ms", "512MiB" and "80%" mean the same here as on the command line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator

from supervisor import units


class Problem(ValueError):
    """A validation error that knows a finer key path than the field it was raised for."""

    def __init__(self, message: str, at: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.at = at


class Unit:
    """Annotation marker: how example_toml() writes a default back ("duration", "size")."""

    def __init__(self, name: str) -> None:
        self.name = name


def check_duration(value: Any) -> float:
    """A duration above zero, in seconds."""
    seconds = units.parse_duration(value)
    if seconds <= 0:
        expected = f"a duration above zero, {units.DURATION_EXPECTED}"
        raise ValueError(f"{value!r} is zero (expected {expected})")
    return seconds


def check_size(value: Any) -> int:
    """A size above zero, in bytes."""
    size = units.parse_size(value)
    if size <= 0:
        raise ValueError(f"{value!r} is zero (expected a size above zero, {units.SIZE_EXPECTED})")
    return size


def check_fraction(value: Any) -> float:
    """A percentage above zero, as a fraction ("80%" -> 0.8)."""
    fraction = units.parse_percent(value)
    if fraction <= 0:
        raise ValueError(f"{value!r} is zero (expected {units.PERCENT_EXPECTED}, above zero)")
    return fraction


def check_rate(value: Any) -> float:
    """A rate above zero, per second ("600/m" -> 10.0)."""
    per_second = units.parse_rate(value)
    if per_second <= 0:
        raise ValueError(f"{value!r} is zero (expected a rate above zero, {units.RATE_EXPECTED})")
    return per_second


def count_from(minimum: int) -> Callable[[Any], int]:
    """The check of an integer (never a boolean) of at least ``minimum``."""

    def check(value: Any) -> int:
        expected = f"(expected an integer >= {minimum})"
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not an integer {expected}")
        if value < minimum:
            raise ValueError(f"{value!r} is too small {expected}")
        return value

    return check


def at_most(check: Callable[[Any], int], maximum: int) -> Callable[[Any], int]:
    """``check``, then at most ``maximum``."""

    def bounded(value: Any) -> int:
        value = check(value)
        if value > maximum:
            raise ValueError(f"{value!r} is too large (expected an integer <= {maximum})")
        return value

    return bounded


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """TOML has no null: ``false`` switches an optional limit off."""
    return lambda value: None if value is None or value is False else check(value)


def choice(*options: str) -> Callable[[Any], str]:
    """The check of one of ``options``."""

    def check(value: Any) -> str:
        if value not in options:
            raise ValueError(
                f"{value!r} is not allowed (expected {' or '.join(map(repr, options))})"
            )
        return value

    return check


def check_flag(value: Any) -> bool:
    """A TOML boolean; no truthy stand-ins."""
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not a boolean (expected true or false)")
    return value


def matching(pattern: str, expected: str) -> Callable[[Any], str]:
    """The check of a string that ``pattern`` matches whole; ``expected`` names it."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise ValueError(f"{value!r} is not valid (expected {expected})")
        return value

    return check


def check_address(value: Any) -> str:
    """``host:port`` (an IPv6 host in brackets)."""
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host.strip("[]") or not port.isdigit() or int(port) > 65535:
        raise ValueError(f'{value!r} is not a host:port address (expected e.g. "127.0.0.1:9464")')
    return value


Duration = Annotated[float, BeforeValidator(check_duration), Unit("duration")]
Size = Annotated[int, BeforeValidator(check_size), Unit("size")]
OptSize = Annotated[int | None, BeforeValidator(optional(check_size)), Unit("size")]
Count = Annotated[int, BeforeValidator(count_from(0))]
Positive = Annotated[int, BeforeValidator(count_from(1))]
OptPositive = Annotated[int | None, BeforeValidator(optional(count_from(1)))]
Name = Annotated[str | None, BeforeValidator(optional(matching(r"\S+", "a name")))]
OptRate = Annotated[float | None, BeforeValidator(optional(check_rate)), Unit("rate")]
