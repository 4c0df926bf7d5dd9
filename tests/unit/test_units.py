"""supervisor.units: the parsers behind every duration, size and percentage users type."""

from __future__ import annotations

import doctest

import pytest

import supervisor.units
from supervisor.units import (
    format_duration,
    format_size,
    parse_duration,
    parse_percent,
    parse_size,
)

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40


def test_doctests_pass() -> None:
    result = doctest.testmod(supervisor.units)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("100ms", 0.1),
        ("30s", 30.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("7d", 604800.0),
        ("0s", 0.0),
        ("45", 45.0),
        (" 30 s ", 30.0),
        (30, 30.0),
        (2.5, 2.5),
        (0, 0.0),
    ],
)
def test_parse_duration_accepts(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert isinstance(parse_duration(text), float)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("5 minutes", "is not a duration"),
        ("5x", "is not a duration"),
        ("30S", "is not a duration"),
        ("", "is not a duration"),
        ("1e3s", "is not a duration"),
        ("s", "is not a duration"),
        ("-5s", "is negative"),
        (-1, "is negative"),
        (True, "is not a duration"),
        (None, "is not a duration"),
        (float("inf"), "is not a duration"),
        (float("nan"), "is not a duration"),
        ([30], "is not a duration"),
    ],
)
def test_parse_duration_rejects(value: object, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(value)  # type: ignore[arg-type]
    _assert_message(str(caught.value), value, says)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512MiB", 512 * MiB),
        ("2GiB", 2 * GiB),
        ("64KiB", 64 * KiB),
        ("1TiB", TiB),
        ("500MB", 500_000_000),
        ("1kB", 1000),
        ("3GB", 3_000_000_000),
        ("1TB", 10**12),
        ("100B", 100),
        ("100", 100),
        ("1.5KiB", 1536),
        ("1.1MiB", 1153434),  # rounded to the nearest byte
        ("512 MiB", 512 * MiB),
        ("12345678901234567890", 12345678901234567890),  # no float rounding
        (4096, 4096),
        (4096.0, 4096),
        (0, 0),
    ],
)
def test_parse_size_accepts(text: str | int, size: int) -> None:
    assert parse_size(text) == size
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("512 Mb", "is not a size"),  # megabits to some; refused rather than guessed
        ("512mib", "is not a size"),
        ("1KB", "is not a size"),
        ("2G", "is not a size"),
        ("lots", "is not a size"),
        ("1.5B", "is not a whole number of bytes"),
        (1.5, "is not a whole number of bytes"),
        ("-1MiB", "is negative"),
        (-1, "is negative"),
        (False, "is not a size"),
        (None, "is not a size"),
    ],
)
def test_parse_size_rejects(value: object, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_size(value)  # type: ignore[arg-type]
    _assert_message(str(caught.value), value, says)


@pytest.mark.parametrize(
    ("value", "fraction"),
    [
        ("80%", 0.8),
        ("12.5%", 0.125),
        ("100%", 1.0),
        ("0%", 0.0),
        (0.1, 0.1),
        (1, 1.0),
        ("0.5", 0.5),
    ],
)
def test_parse_percent_accepts(value: str | float, fraction: float) -> None:
    assert parse_percent(value) == fraction


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("120%", "is more than 100%"),
        (1.5, "is more than 100%"),
        ("-5%", "is negative"),
        ("80 percent", "is not a percentage"),
        ("80%%", "is not a percentage"),
        (True, "is not a percentage"),
    ],
)
def test_parse_percent_rejects(value: object, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_percent(value)  # type: ignore[arg-type]
    _assert_message(str(caught.value), value, says)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (0.0015, "1.5ms"),
        (1.5, "1.5s"),
        (30, "30s"),
        (90, "90s"),
        (60, "1m"),
        (300, "5m"),
        (5400, "90m"),
        (3600, "1h"),
        (604800, "7d"),
        (3700.5, "3700.5s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0B"),
        (100, "100B"),
        (1024, "1KiB"),
        (1000, "1kB"),
        (512 * MiB, "512MiB"),
        (200 * MiB, "200MiB"),
        (2 * GiB, "2GiB"),
        (500_000_000, "500MB"),
        (1536, "1.5KiB"),
        (1_500_000, "1.4MiB"),
        (3 * 1024 * TiB, "3072TiB"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.parametrize("seconds", [0.001, 0.25, 1.5, 30, 59, 60, 61, 600, 3600, 86400, 9e6])
def test_format_duration_reads_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("size", [1, 1000, 1024, 512 * MiB, 200 * MiB, 2 * GiB, 10**12, 5 * TiB])
def test_format_size_reads_back_exact_sizes(size: int) -> None:
    assert parse_size(format_size(size)) == size


@pytest.mark.parametrize(
    ("formatter", "value"),
    [(format_duration, -1), (format_duration, float("inf")), (format_size, -1)],
)
def test_formatters_refuse_negatives(formatter: object, value: float) -> None:
    with pytest.raises(ValueError, match="expected"):
        formatter(value)  # type: ignore[operator]


def _assert_message(message: str, value: object, says: str) -> None:
    """One line: the bad value's repr, what was wrong, and what was expected."""
    assert "\n" not in message
    assert message.startswith(repr(value))
    assert says in message
    assert "(expected " in message and message.endswith(")")
