"""Waiting for events instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Call ``predicate`` until it returns something truthy, and return that; fail after
    ``timeout`` seconds with the last value seen. The poll interval grows to 0.2 s."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {last!r})")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.2)
        last = predicate()
    return last
