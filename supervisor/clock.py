"""The one source of time in the parent.

``monotonic()`` is for every in-process deadline and duration (timeouts, grace, heartbeat due,
backoff); ``now()`` is Unix time in UTC and is only for values written to the database. Nothing
else in fleetd calls ``time.time()``: tests inject a ``FakeClock``.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def now(self) -> float: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to; both readings advance together."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._mono = 1000.0

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds
        self._mono += seconds
