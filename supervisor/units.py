"""Parsers and formatters for the quantities users type in fleet.toml and on the command line.

Durations are ``"250ms"``, ``"30s"``, ``"5m"``, ``"1h"``, ``"7d"`` or a number of seconds; sizes
are ``"512MiB"``, ``"2GiB"``, ``"500MB"`` or a number of bytes; percentages are ``"80%"``.

Pure functions, no I/O. Every parser raises ``ValueError`` whose text is one line, the bad value's
repr and what was expected, so a caller only prefixes where the value came from. Negative values
are refused here; whether zero makes sense is the caller's decision.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

DURATION_EXPECTED = 'e.g. "250ms", "30s", "5m", "1h" or a number of seconds'
SIZE_EXPECTED = 'e.g. "512MiB", "2GiB", "500MB" or a number of bytes'
PERCENT_EXPECTED = 'e.g. "80%" or a fraction between 0 and 1'
RATE_EXPECTED = 'e.g. "50/s", "600/m" or "1000/h"'

# unit -> (multiplier, divisor) in seconds; dividing for "ms" keeps "250ms" exactly 0.25.
_DURATION_UNITS = {"ms": (1, 1000), "s": (1, 1), "m": (60, 1), "h": (3600, 1), "d": (86400, 1)}
# Case matters: "Mb" is megabits to many readers, so only the standard spellings are accepted.
_SIZE_UNITS = {
    "B": 1,
    "kB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_RATE_UNITS = {"s": 1, "m": 60, "h": 3600}  # per second, per minute, per hour
_RATE = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*/\s*(?P<unit>[a-z]+)\s*")
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_DECIMAL = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))
# No exponent form in strings: "1e3s" reads as a typo more often than as a number.
_QUANTITY = re.compile(r"\s*(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>[A-Za-z%]*)\s*")


def _bad(value: Any, what: str, expected: str) -> ValueError:
    return ValueError(f"{value!r} is not {what} (expected {expected})")


def _split(value: str, what: str, expected: str) -> tuple[Decimal, str]:
    """``"1.5 GiB"`` -> (Decimal("1.5"), "GiB"); refuses anything else and negatives."""
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise _bad(value, what, expected)
    number = Decimal(match["number"])
    if number < 0:
        raise ValueError(f"{value!r} is negative (expected {expected})")
    return number, match["unit"]


def _plain_number(value: Any, what: str, expected: str) -> float | int:
    """A TOML number as it is: not a bool (a bool is an int in Python), finite, not negative."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(value, what, expected)
    if not math.isfinite(value):
        raise _bad(value, what, expected)
    if value < 0:
        raise ValueError(f"{value!r} is negative (expected {expected})")
    return value


def parse_duration(value: str | float) -> float:
    """A duration in seconds, from ``"250ms"``, ``"30s"``, ``"5m"``, ``"1h"``, ``"7d"`` or a number.

    >>> parse_duration("250ms")
    0.25
    >>> parse_duration("1.5s")
    1.5
    >>> parse_duration("5m"), parse_duration("1h"), parse_duration(30)
    (300.0, 3600.0, 30.0)
    >>> parse_duration("5 minutes")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: '5 minutes' is not a duration (expected e.g. "250ms", ...)
    """
    what = "a duration"
    if not isinstance(value, str):
        return float(_plain_number(value, what, DURATION_EXPECTED))
    number, unit = _split(value, what, DURATION_EXPECTED)
    factor = _DURATION_UNITS.get(unit or "s")
    if factor is None:
        raise _bad(value, what, DURATION_EXPECTED)
    seconds = float(number * factor[0] / factor[1])
    if not math.isfinite(seconds):
        raise _bad(value, what, DURATION_EXPECTED)
    return seconds


def parse_size(value: str | int) -> int:
    """A size in bytes, from ``"512MiB"``, ``"2GiB"``, ``"500MB"``, ``"64KiB"``, ``"1kB"``,
    ``"100B"`` or a whole number of bytes. Fractions of a unit round to the nearest byte.

    >>> parse_size("512MiB")
    536870912
    >>> parse_size("500MB"), parse_size("1kB"), parse_size("1.5KiB"), parse_size(4096)
    (500000000, 1000, 1536, 4096)
    >>> parse_size("512 Mb")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: '512 Mb' is not a size (expected e.g. "512MiB", ...)
    """
    what = "a size"
    if isinstance(value, str):
        number, unit = _split(value, what, SIZE_EXPECTED)
        factor = _SIZE_UNITS.get(unit or "B")
        if factor is None:
            raise _bad(value, what, SIZE_EXPECTED)
    else:
        number, factor = Decimal(_plain_number(value, what, SIZE_EXPECTED)), 1
    if factor == 1 and number != number.to_integral_value():
        raise _bad(value, "a whole number of bytes", SIZE_EXPECTED)
    # Decimal, not float: "12345678901234567890" and "1.1MiB" must not pick up binary noise.
    return int((number * factor).to_integral_value())


def parse_percent(value: str | float) -> float:
    """A fraction in [0, 1], from ``"80%"`` or a number such as ``0.8``.

    >>> parse_percent("80%"), parse_percent("12.5%"), parse_percent(0.1)
    (0.8, 0.125, 0.1)
    >>> parse_percent("120%")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: '120%' is more than 100% (expected e.g. "80%" ...)
    """
    what = "a percentage"
    if isinstance(value, str):
        number, unit = _split(value, what, PERCENT_EXPECTED)
        if unit not in ("%", ""):
            raise _bad(value, what, PERCENT_EXPECTED)
        fraction = float(number / 100) if unit == "%" else float(number)
    else:
        fraction = float(_plain_number(value, what, PERCENT_EXPECTED))
    if fraction > 1:
        raise ValueError(f"{value!r} is more than 100% (expected {PERCENT_EXPECTED})")
    return fraction


def _trim(number: float, places: int) -> str:
    return f"{number:.{places}f}".rstrip("0").rstrip(".")


def format_duration(seconds: float) -> str:
    """Seconds for humans, in the largest unit that keeps the value whole; parse_duration reads
    it back (to the millisecond).

    >>> format_duration(0.25), format_duration(1.5), format_duration(30), format_duration(90)
    ('250ms', '1.5s', '30s', '90s')
    >>> format_duration(300), format_duration(3600), format_duration(7 * 86400)
    ('5m', '1h', '7d')
    """
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"{seconds!r} is not a duration (expected a number >= 0)")
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds // size)}{unit}"
    if seconds == 0 or seconds >= 1:
        return _trim(seconds, 3) + "s"
    return _trim(seconds * 1000, 3) + "ms"


def format_size(size: int) -> str:
    """Bytes for humans: exact in the largest unit that keeps it whole and below 1024, otherwise
    rounded to one decimal in binary units.

    >>> format_size(512 * 2**20), format_size(2 * 2**30), format_size(500_000_000)
    ('512MiB', '2GiB', '500MB')
    >>> format_size(100), format_size(1536), format_size(1_500_000)
    ('100B', '1.5KiB', '1.4MiB')
    """
    if isinstance(size, bool) or size < 0:
        raise ValueError(f"{size!r} is not a size (expected a number of bytes >= 0)")
    for unit, factor in (*_BINARY, *_DECIMAL):
        if size >= factor and size % factor == 0 and size // factor < 1024:
            return f"{size // factor}{unit}"
    for unit, factor in _BINARY:
        if size >= factor:
            return _trim(size / factor, 1) + unit
    return f"{int(size)}B"


def parse_rate(value: str) -> float:
    """A rate as events per second: a number, a slash and ``s``, ``m`` or ``h``. Only the
    string form: a bare number would leave its unit to guess.

    >>> parse_rate("50/s"), parse_rate("600/m"), parse_rate("1800/h"), parse_rate("0.5/s")
    (50.0, 10.0, 0.5, 0.5)
    >>> parse_rate(" 10 / s ")
    10.0
    >>> parse_rate("50")
    Traceback (most recent call last):
    ...
    ValueError: '50' is not a rate (expected e.g. "50/s", "600/m" or "1000/h")
    >>> parse_rate("5/d")
    Traceback (most recent call last):
    ...
    ValueError: '5/d' is not a rate (expected e.g. "50/s", "600/m" or "1000/h")
    """
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None or match["unit"] not in _RATE_UNITS:
        if isinstance(value, str) and value.strip().startswith("-"):
            raise ValueError(f"{value!r} is negative (expected {RATE_EXPECTED})")
        raise _bad(value, "a rate", RATE_EXPECTED)
    return float(Decimal(match["number"]) / _RATE_UNITS[match["unit"]])


def format_rate(per_second: float) -> str:
    """The inverse of ``parse_rate``, in the largest unit that keeps a whole-ish number.

    >>> format_rate(50.0), format_rate(10 / 60), format_rate(0.5), format_rate(1 / 3600)
    ('50/s', '10/m', '0.5/s', '1/h')
    """
    for unit, factor in (("s", 1), ("m", 60), ("h", 3600)):
        count = per_second * factor
        if count >= 1 and (unit == "h" or abs(count - round(count)) < 1e-9 or count >= 10):
            return f"{_trim(count, 3)}/{unit}"
        if unit == "s" and count >= 0.1 and abs(count * 10 - round(count * 10)) < 1e-9:
            return f"{_trim(count, 3)}/{unit}"
    return f"{_trim(per_second * 3600, 3)}/h"
