"""Handlers for benchmarks and stress runs, usable from any fleet.toml as
``stress.fixtures:<name>``. Plain functions: JSON in, JSON out."""

from __future__ import annotations

import time
from typing import Any


def noop(payload: dict[str, Any]) -> None:
    """Does nothing: measures fleetd's own overhead per job."""


def burn(payload: dict[str, Any]) -> int:
    """CPU for ``ms`` milliseconds."""
    end = time.perf_counter() + payload.get("ms", 10) / 1000
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def sleep(payload: dict[str, Any]) -> None:
    """Waits ``seconds`` (a slow downstream)."""
    time.sleep(float(payload.get("seconds", 0.1)))
