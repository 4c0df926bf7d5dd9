"""The rate-limited claim: ``SqlStore.claim_rated``, for pools with ``rate_limit`` or
``kind_rate_limit``.

One transaction, serialised per pool as the capped claim is (SQLite: ``BEGIN IMMEDIATE``;
PostgreSQL: the pool's advisory lock, ``_lock_claims``), so the buckets a claim reads stay
true until it has spent from them, on every host:

1. read the pool's bucket rows (``fleetd_rate_buckets``: the pool's, key ``''``, and one per
   limited kind) and the claim's "now" (the database's clock on PostgreSQL, the injected one
   on SQLite); ``rates.allow``: how many jobs, of which kinds, the tokens pay for;
2. claim within that: a pool without caps and without kind rates runs the plain claim's own
   statement (its order, whatever it is) with ``n`` cut to the tokens; otherwise the capped
   claim (supervisor/store/capped.py) with each limited kind capped at its running jobs plus
   its tokens, so a kind is read on its own and never takes more than it may, as a capped
   kind is;
3. ``rates.after``: the new levels, written back (an upsert per bucket), and when the next
   token is due, which the reply carries so the dispatcher's next claim waits for it.

Cost: a few primary-key reads and writes on top of the claim, whatever the backlog (the one
extra read, a probe for any ready job of the claimed kinds when the tokens allowed none, stops
at the first ready entry of the claim's index). A pool without rate limits never comes here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.sql.elements import ColumnElement

from supervisor import rates
from supervisor.model import ClaimLimits, JobState
from supervisor.store import driver
from supervisor.store.budget import Budgets
from supervisor.store.claim import ClaimRequest
from supervisor.store.rows import CLAIMED_AT, ClaimRow, claim_order, claim_row
from supervisor.store.schema import jobs, rate_buckets

QUEUED = JobState.QUEUED.value
KIND = 2  # a ClaimRow's kind (rows.claim_row: id, token, kind, ...)


class RatedRows(NamedTuple):
    """A rate-limited claim's answer: the jobs (``ClaimRow``s, in claim order); seconds until
    the pool's next token (None: it has one left); seconds until each drained kind's next
    token; whether the rate held back a job that was ready."""

    rows: list[ClaimRow]
    wait: float | None
    kind_waits: dict[str, float]
    held: bool


class RatedClaims:
    """The rate-limited claim, for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore and CappedClaims
        _budgets: Budgets

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...
        def _insert(self) -> Any: ...
        def _mostly_true(self, condition: ColumnElement[bool]) -> ColumnElement[bool]: ...
        def _lock_claims(self, conn: Connection, pool: str) -> None: ...
        def _one_now(self, now: float) -> AbstractContextManager[None]: ...
        def _plain_claim(
            self, pool: str, kinds: Collection[str], n: int, node: str, lease: float
        ) -> tuple[driver.Raw, dict[str, Any]]: ...
        def _capped_in(
            self,
            conn: Connection,
            claim: ClaimRequest,
            limits: ClaimLimits,
            kind_tokens: dict[str, int] | None = None,
        ) -> list[ClaimRow]: ...

    def claim_rated(self, claim: ClaimRequest, rate: rates.RateLimit) -> RatedRows:
        """``claim_rows``, spending the pool's fleet-wide rate-limit tokens: at most as many
        jobs as the pool's bucket holds whole tokens, and of a limited kind at most its
        bucket's. Jobs the rate holds back stay queued, untouched (no delivery counted)."""
        pool, kinds, n = claim.pool, claim.kinds, claim.n
        if n <= 0 or not kinds:
            return RatedRows([], None, {}, False)
        buckets = rate.buckets(kinds)
        with self._tx() as conn:
            self._lock_claims(conn, pool)
            now = float(self._exec(conn, select(self._now())).scalar_one())
            stored = {
                r.kind: (r.tokens, r.counted_at)
                for r in self._exec(conn, self._buckets_stmt, {"r_pool": pool})
            }
            levels = {
                key: bucket.level(*stored.get(key, (None, None)), now)
                for key, bucket in buckets.items()
            }
            allowance = rates.allow(rate, levels, n, kinds)
            with self._one_now(now):  # the jobs start at the time the tokens were counted
                rows = self._rated_rows(conn, claim, allowance)
                ready = self._held_back(conn, pool, kinds, allowance, n, len(rows))
            taken = Counter(r[KIND] for r in rows)
            spent = rates.after(rate, levels, allowance, n, taken, ready)
            if rows:  # nothing spent: the stored rows still say the same (refill is computed)
                self._write_buckets(conn, pool, spent.levels, now, stored)
        return RatedRows(rows, spent.wait, spent.kind_waits, spent.held)

    def _rated_rows(
        self, conn: Connection, claim: ClaimRequest, allowance: rates.Allowance
    ) -> list[ClaimRow]:
        """The claim within the tokens: its kinds and size cut to the allowance (its
        ``finished`` kept: a fair pool's order leaves this node's unwritten results out)."""
        if allowance.n <= 0 or not allowance.kinds:
            return []
        limits = claim.limits or ClaimLimits()
        # rated claims hold the pool's claim lock already, so the fair order costs them no
        # serialisation: a fair pool takes it on every rated claim (the plain statement
        # below would be FIFO whatever the tenants)
        within = replace(claim, kinds=allowance.kinds, n=allowance.n)
        if limits.capped or allowance.kind_tokens or limits.fair:
            return self._capped_in(conn, within, limits, dict(allowance.kind_tokens))
        pool = claim.pool
        raw, params = self._plain_claim(pool, within.kinds, within.n, claim.node, claim.lease)
        rows = driver.fetchall(conn, raw, params)
        if claim.budget is not None and rows:
            at = rows[0][CLAIMED_AT]
            self._budgets.count_deliveries(conn, pool, claim.budget, len(rows), at)
        rows.sort(key=claim_order)
        return [claim_row(r) for r in rows]

    def _held_back(
        self,
        conn: Connection,
        pool: str,
        kinds: Collection[str],
        allowance: rates.Allowance,
        n: int,
        taken: int,
    ) -> bool:
        """Whether a ready job may wait because the allowance left it out. When it allowed
        nothing: one probe for a ready job of ``kinds`` (the first entry of the claim's index
        answers). When it left some kinds out and the claim came back short: assumed (a probe
        for one kind could walk every queued row of the others: no index leads with kind; the
        status view shows "held by rate" only with a backlog)."""
        if allowance.n <= 0 or not allowance.kinds:
            return self._any_ready(conn, pool, kinds)
        return len(allowance.kinds) < len(kinds) and taken < n

    def _any_ready(self, conn: Connection, pool: str, kinds: Collection[str]) -> bool:
        """Whether a job of ``kinds`` is ready in ``pool`` (the first index entry answers)."""
        params = {"r_pool": pool, "r_kinds": sorted(kinds)}
        return self._exec(conn, self._ready_stmt, params).first() is not None

    def _write_buckets(
        self,
        conn: Connection,
        pool: str,
        levels: dict[str, float],
        now: float,
        stored: dict[str, tuple[float, float]],
    ) -> None:
        """Write the new levels, each counted at the later of ``now`` and its last count. A
        claim's now can be earlier (a clock stepped back; on PostgreSQL ``now()`` is when the
        transaction began, before it waited for the pool's lock while another host's claim
        counted): ``Bucket.level`` refilled nothing for it, and writing the earlier time would
        let the next claim refill those seconds a second time."""
        values = [
            {
                "pool": pool,
                "kind": key,
                "tokens": level,
                "counted_at": max(now, stored[key][1]) if key in stored else now,
            }
            for key, level in levels.items()
        ]
        if values:
            conn.execute(self._upsert_stmt, values)

    def rate_levels(self, pool: str) -> dict[str, tuple[float, float]]:
        """The pool's bucket rows as stored: key -> (tokens, counted_at). For tests and
        status; the level now needs the bucket's rate (``rates.Bucket.level``)."""
        with self._tx() as conn:
            rows = self._exec(conn, self._buckets_stmt, {"r_pool": pool})
            return {r.kind: (r.tokens, r.counted_at) for r in rows}

    @cached_property
    def _buckets_stmt(self) -> Any:
        b = rate_buckets.c
        return select(b.kind, b.tokens, b.counted_at).where(b.pool == bindparam("r_pool"))

    @cached_property
    def _upsert_stmt(self) -> Any:
        stmt = self._insert()(rate_buckets)
        return stmt.on_conflict_do_update(
            index_elements=["pool", "kind"],
            set_={"tokens": stmt.excluded.tokens, "counted_at": stmt.excluded.counted_at},
        )

    @cached_property
    def _ready_stmt(self) -> Any:
        return (
            select(jobs.c.id)
            .where(
                jobs.c.pool == bindparam("r_pool"),
                jobs.c.state == QUEUED,
                self._mostly_true(jobs.c.available_at <= self._now()),
                jobs.c.kind.in_(bindparam("r_kinds", expanding=True)),
            )
            .limit(1)
        )


def with_kind_tokens(
    limits: ClaimLimits, running: Counter[str] | None, kind_tokens: dict[str, int]
) -> ClaimLimits:
    """``limits`` with each rate-limited kind capped at its leased jobs plus its tokens (and
    its own cap, if lower): the capped claim then takes at most the tokens of that kind."""
    running = running or Counter()
    caps = dict(limits.kind_max_inflight)
    for kind, tokens in kind_tokens.items():
        room = running[kind] + tokens
        caps[kind] = min(caps[kind], room) if kind in caps else room
    return replace(limits, kind_max_inflight=caps)
