"""supervisor.rates: the token bucket's arithmetic, with a fake clock (plain numbers)."""

from __future__ import annotations

import doctest

import pytest

import supervisor.rates
from supervisor.rates import POOL, Allowance, Bucket, RateLimit, after, allow, default_burst
from supervisor.units import format_rate, parse_rate


def test_doctests_pass() -> None:
    result = doctest.testmod(supervisor.rates)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    ("tokens", "counted_at", "now", "level"),
    [
        (None, None, 100.0, 10.0),  # a new bucket is full
        (0.0, 100.0, 100.0, 0.0),
        (0.0, 100.0, 100.05, 0.5),
        (0.0, 100.0, 100.1, 1.0),
        (4.0, 100.0, 101.0, 10.0),  # never above the burst
        (4.0, 100.0, 99.0, 4.0),  # a clock that went back refills nothing
        (0.0, 1_800_000_000.0, 1_800_000_000.1, 1.0),  # 0.1 s in epoch doubles is whole
    ],
)
def test_level(tokens, counted_at, now, level) -> None:
    assert Bucket(10.0, 10.0).level(tokens, counted_at, now) == pytest.approx(level)


def test_a_fake_clock_run_never_starts_more_than_burst_plus_rate_times_the_window() -> None:
    """A claimer that wants 7 jobs every 30 ms for 3 s against 10/s with a burst of 10."""
    bucket, limit = Bucket(10.0, 10.0), RateLimit(Bucket(10.0, 10.0))
    tokens, at, starts = None, None, []
    for step in range(100):
        now = step * 0.03
        level = bucket.level(tokens, at, now)
        allowed = allow(limit, {POOL: level}, 7, ["a"])
        # jobs are always ready: the store's probe finds one whenever none was allowed
        spent = after(limit, {POOL: level}, allowed, 7, {"a": allowed.n}, allowed.n == 0)
        starts += [now] * allowed.n
        tokens, at = spent.levels[POOL], now
        if spent.wait is not None:
            assert spent.held and spent.wait <= 0.1 + 1e-9
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= 10 + 10 * (starts[j] - first) + 1e-9
    assert len(starts) == pytest.approx(10 + 10 * 2.97, abs=1.5), "and it does use the rate"


@pytest.mark.parametrize(
    ("levels", "n", "kinds", "expected"),
    [
        ({POOL: 0.99}, 5, ["a"], Allowance(0, ("a",), {})),  # "b" not claimed: not read
        ({POOL: 2.0, "b": 2.0}, 5, ["a", "b"], Allowance(2, ("a", "b"), {"b": 2})),
        ({POOL: 9.0, "b": 1.5}, 5, ["a", "b"], Allowance(5, ("a", "b"), {"b": 1})),
        ({POOL: 9.0, "b": 0.5}, 5, ["a", "b"], Allowance(5, ("a",), {})),
        ({"b": 3.0}, 5, ["b"], Allowance(5, ("b",), {"b": 3})),
    ],
)
def test_allow(levels, n, kinds, expected) -> None:
    limit = RateLimit(Bucket(10.0, 10.0) if POOL in levels else None, {"b": Bucket(2.0, 2.0)})
    assert allow(limit, levels, n, kinds) == expected


def test_after_names_the_drained_kinds_and_whether_a_ready_job_was_held() -> None:
    limit = RateLimit(None, {"b": Bucket(2.0, 2.0)})
    allowance = Allowance(5, ("a", "b"), {"b": 1})
    spent = after(limit, {"b": 1.5}, allowance, 5, {"a": 1, "b": 1}, False)
    assert spent.levels == {"b": 0.5} and spent.wait is None
    assert spent.kind_waits == {"b": pytest.approx(0.25)} and spent.held
    left_out = after(limit, {"b": 0.5}, Allowance(5, ("a",), {}), 5, {}, True)
    assert left_out.held and left_out.kind_waits == {"b": pytest.approx(0.25)}
    assert not after(limit, {"b": 0.5}, Allowance(5, ("a",), {}), 5, {}, False).held


@pytest.mark.parametrize(("rate", "burst"), [(50.0, 50.0), (0.5, 1.0), (1 / 60, 1.0)])
def test_the_default_burst_is_one_second_and_at_least_one_job(rate, burst) -> None:
    assert default_burst(rate) == burst


@pytest.mark.parametrize(
    ("text", "per_second", "shown"),
    [
        ("50/s", 50.0, "50/s"),
        ("120/m", 2.0, "2/s"),
        ("90/m", 1.5, "1.5/s"),
        ("3/h", 3 / 3600, "3/h"),
    ],
)
def test_rates_parse_and_format(text, per_second, shown) -> None:
    assert parse_rate(text) == pytest.approx(per_second)
    assert format_rate(parse_rate(text)) == shown


@pytest.mark.parametrize("text", ["50", "50/d", "/s", "-5/s", "5 per s", 50, "1e3/s"])
def test_bad_rates_are_one_line_errors(text) -> None:
    with pytest.raises(ValueError, match=r"expected e\.g\. \"50/s\"") as caught:
        parse_rate(text)
    assert "\n" not in str(caught.value)
