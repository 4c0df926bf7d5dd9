"""Pure decisions: values in, values out. No I/O, no clock reads, no randomness of its own
(jitter comes in as ``rng``), so every rule here is tested with tables.

- ``retry_delay``: exponential backoff with full jitter, for a failed delivery.
- ``respawn_delay``: how long a pool waits before forking again after workers died at boot.
- ``poll_delay``: the adaptive poll interval of an idle pool.
- ``KillReason``: why the parent killed a worker (``supervisor.run.exits`` turns it and the
  exit status into the job's fate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Random(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def backoff_cap(attempt: int, base: float, cap: float) -> float:
    """The upper bound of the delay before retry number ``attempt`` (1 after the first
    failed delivery): base, 2 base, 4 base, ... never above cap.

    >>> [backoff_cap(a, 1.0, 10.0) for a in (1, 2, 3, 4, 5)]
    [1.0, 2.0, 4.0, 8.0, 10.0]
    """
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 s is already forever; avoid overflow
    return min(cap, base * (2.0**exponent))


def retry_delay(attempt: int, base: float, cap: float, rng: Random) -> float:
    """Full jitter: uniform between 0 and the backoff cap, so a crowd of jobs that failed
    together does not come back together."""
    return rng.uniform(0.0, backoff_cap(attempt, base, cap))


RESPAWN_BASE = 0.5
RESPAWN_MAX = 30.0


def respawn_delay(boot_failures: int) -> float:
    """Seconds to wait before the next fork after ``boot_failures`` workers in a row died
    before they were ready: 0 for none, then 0.5 s doubling to 30 s.

    >>> [respawn_delay(n) for n in (0, 1, 2, 3, 9)]
    [0.0, 0.5, 1.0, 2.0, 30.0]
    """
    if boot_failures <= 0:
        return 0.0
    return min(RESPAWN_MAX, RESPAWN_BASE * 2.0 ** min(boot_failures - 1, 30))


POLL_MIN = 0.05
POLL_MAX = 1.0


def poll_delay(empty_claims: int) -> float:
    """The wait before polling an idle pool again after ``empty_claims`` claims in a row came
    back short: 50 ms doubling to 1 s. Wake-ups (NOTIFY, local datagrams) cut it short.

    >>> [poll_delay(n) for n in (0, 1, 2, 5, 10)]
    [0.05, 0.1, 0.2, 1.0, 1.0]
    """
    return min(POLL_MAX, POLL_MIN * 2.0 ** min(empty_claims, 20))


@dataclass(frozen=True, slots=True)
class KillReason:
    """Why the parent killed a worker; decides what happens to its job."""

    kind: str  # "memory_limit", "timeout", "lease_lost", "drain", "retire"
    detail: str = ""
