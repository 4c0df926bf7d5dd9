"""Pure: the token buckets behind ``rate_limit`` and ``kind_rate_limit``.

A pool's rate limit is a token bucket held in the database (supervisor/store/rated.py): one
row for the pool and one per limited kind, each spent by every host's claims. A bucket holds
at most ``burst`` tokens and gains ``rate`` a second; a claim of k jobs spends k tokens of the
pool's bucket and one of its kind's bucket per job of a limited kind. A new bucket starts full.
So in any window of w seconds at most ``burst + rate × w`` jobs start, whatever the number of
hosts, and a backlog drains at ``rate`` once the burst is spent.

Values in, values out: the store reads each bucket's tokens and when they were counted, with
the database's clock, calls ``allow`` to learn how many jobs the claim may take, and after the
claim ``after`` for the new levels and when the next token is due (the dispatcher's next claim
waits until then instead of asking again). Tested with tables in tests/unit/test_rates.py.

What it cannot do: tokens are spent at the claim, not at the job's start, and are not given
back when a claimed job is released (a drain, a pause) or returned unstarted: the limit is an
upper bound, and a refund would be a write on every release path for a few tokens, in a rare
case, that only matter to a pool already below its limit.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

POOL = ""  # the pool's own bucket's key beside its kinds' (a kind is never named "")
EPSILON = 1e-9  # tokens: 0.1 + 0.2 refills are not less than a whole token


@dataclass(frozen=True, slots=True)
class Bucket:
    """One budget: ``rate`` tokens a second, at most ``burst`` held."""

    rate: float
    burst: float

    def level(self, tokens: float | None, counted_at: float | None, now: float) -> float:
        """Tokens now, from ``tokens`` counted at ``counted_at`` (None: a new bucket, full).
        A clock that went back refills nothing, and a lowered burst caps what was saved.

        >>> Bucket(10, 10).level(None, None, 5.0)
        10.0
        >>> Bucket(10, 10).level(0.0, 5.0, 5.25)
        2.5
        >>> Bucket(10, 10).level(3.0, 5.0, 4.0)
        3.0
        """
        if tokens is None or counted_at is None:
            return float(self.burst)
        # to the microsecond: Unix seconds in a double are only that precise (0.1 s after
        # 1.8e9 reads as 0.0999999 s, which would leave a whole token a hair short)
        elapsed = max(0.0, round(now - counted_at, 6))
        return min(float(self.burst), tokens + elapsed * self.rate)

    def due_in(self, level: float) -> float:
        """Seconds until the bucket holds a whole token (0: it does now).

        >>> Bucket(10, 10).due_in(0.5), Bucket(10, 10).due_in(1.0)
        (0.05, 0.0)
        """
        return 0.0 if level + EPSILON >= 1 else (1 - level) / self.rate


def whole(level: float) -> int:
    """Jobs a level pays for.

    >>> whole(2.9999999999), whole(0.99), whole(3.0)
    (3, 0, 3)
    """
    return max(0, math.floor(level + EPSILON))


def default_burst(rate: float) -> float:
    """One second's worth of ``rate``, and at least one job (else nothing could start)."""
    return max(1.0, rate)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A pool's rate limits as the store's claim takes them: its own bucket (None: none) and
    one per limited kind."""

    pool: Bucket | None = None
    kinds: Mapping[str, Bucket] = field(default_factory=dict)

    @classmethod
    def of(
        cls, rate: float | None, burst: int | None, kind_rates: Mapping[str, float]
    ) -> RateLimit | None:
        """A pool's limits from its config (``rate_limit``, ``rate_burst``,
        ``kind_rate_limit``); None when it has none. A kind's bucket holds one second of it.

        >>> RateLimit.of(50.0, None, {"enrich": 0.5})
        RateLimit(pool=Bucket(rate=50.0, burst=50.0), kinds={'enrich': Bucket(rate=0.5, burst=1.0)})
        >>> RateLimit.of(None, None, {}) is None
        True
        """
        if rate is None and not kind_rates:
            return None
        pool = None
        if rate is not None:
            pool = Bucket(rate, float(burst) if burst is not None else default_burst(rate))
        kinds = {k: Bucket(r, default_burst(r)) for k, r in kind_rates.items()}
        return cls(pool, kinds)

    def buckets(self, kinds: Collection[str]) -> dict[str, Bucket]:
        """The buckets a claim of ``kinds`` reads, by key (``POOL`` for the pool's)."""
        out = {POOL: self.pool} if self.pool is not None else {}
        out.update((k, b) for k, b in self.kinds.items() if k in kinds)
        return out


@dataclass(frozen=True, slots=True)
class Allowance:
    """What a claim may take: ``n`` jobs in all, of ``kinds`` only, and at most
    ``kind_tokens[k]`` of a limited kind k."""

    n: int
    kinds: tuple[str, ...]
    kind_tokens: Mapping[str, int]


def allow(
    limit: RateLimit, levels: Mapping[str, float], n: int, kinds: Collection[str]
) -> Allowance:
    """The claim's allowance from the buckets' ``levels`` (by key) for a claim of ``n`` jobs
    of ``kinds``: the pool's whole tokens bound ``n``; a limited kind without a whole token
    is left out, one with some is bounded by them.

    >>> limit = RateLimit(Bucket(10, 10), {"enrich": Bucket(2, 2)})
    >>> allow(limit, {"": 3.5, "enrich": 2.0}, 8, ["enrich", "mail"])
    Allowance(n=3, kinds=('enrich', 'mail'), kind_tokens={'enrich': 2})
    >>> allow(limit, {"": 3.5, "enrich": 0.4}, 8, ["enrich", "mail"])
    Allowance(n=3, kinds=('mail',), kind_tokens={})
    """
    room = min(n, whole(levels[POOL])) if POOL in levels else n
    tokens = {k: whole(levels[k]) for k in sorted(kinds) if k in limit.kinds}
    open_kinds = tuple(k for k in sorted(kinds) if tokens.get(k, 1) > 0)
    return Allowance(room, open_kinds, {k: t for k, t in tokens.items() if t > 0})


@dataclass(frozen=True, slots=True)
class Spent:
    """After a claim: each bucket's new level, the seconds until the pool's next token
    (None: it has one), those until each drained kind's, and whether the rate holds work
    back (``held``: the claim took all it was allowed and wanted more, or spent a bucket's
    last whole token: a job still ready must wait for the next; whether one is, the backlog
    says, and the status view shows "held by rate" only with a backlog)."""

    levels: dict[str, float]
    wait: float | None
    kind_waits: dict[str, float]
    held: bool


def after(
    limit: RateLimit,
    levels: Mapping[str, float],
    allowance: Allowance,
    n: int,
    taken: Mapping[str, int],
    ready_left_out: bool,
) -> Spent:
    """Spend what the claim took (``taken``: jobs per kind) from ``levels``. ``ready_left_out``:
    a ready job may wait because the allowance left it out (the store's ``_held_back``).

    >>> limit = RateLimit(Bucket(10, 10))
    >>> after(limit, {"": 3.5}, Allowance(3, ("a",), {}), 8, {"a": 3}, False)
    Spent(levels={'': 0.5}, wait=0.05, kind_waits={}, held=True)
    >>> after(limit, {"": 3.5}, Allowance(3, ("a",), {}), 8, {"a": 1}, False)
    Spent(levels={'': 2.5}, wait=None, kind_waits={}, held=False)
    """
    total = sum(taken.values())
    new = dict(levels)
    if POOL in new:
        new[POOL] -= total
    for kind, bucket_taken in taken.items():
        if kind in new and kind != POOL:
            new[kind] -= bucket_taken
    wait = None
    if limit.pool is not None and POOL in new:
        due = limit.pool.due_in(new[POOL])
        wait = due if due > 0 else None
    kind_waits = {}
    for kind, bucket in limit.kinds.items():
        if kind in new and (due := bucket.due_in(new[kind])) > 0:
            kind_waits[kind] = due
    pool_bound = allowance.n < n and total >= allowance.n and allowance.n > 0
    kind_bound = total < allowance.n and any(
        taken.get(k, 0) >= t for k, t in allowance.kind_tokens.items()
    )
    # a claim that spent the last whole token: the next job, if one waits, waits for a token
    drained = (total > 0 and wait is not None) or any(taken.get(k) for k in kind_waits)
    return Spent(new, wait, kind_waits, pool_bound or kind_bound or drained or ready_left_out)
