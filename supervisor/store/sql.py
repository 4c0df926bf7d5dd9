"""``SqlStore``: the lease state machine's verbs in SQLAlchemy Core, shared by both dialects.

Every verb is one transaction (or one autocommit statement), so a crash or an outage between
verbs leaves the queue in a state the verbs already know. Every write after a claim is guarded by
state and lease token in its WHERE clause and reports which rows it changed: a late ack from a
worker whose lease was taken over changes nothing and comes back as lost.

Dialects differ only where they must (``SqliteStore``, ``PostgresStore``): how "now" is read, how
a lease token is made, connection set-up, and the wake-up channel. This module holds the store's
core (the engine, its transactions and clock, the dialect hooks) and the claim; the other verbs
are mixins of ``SqlStore``, one module per noun, each declaring what it takes from the core:

- enqueue.py: new jobs, and a keyed job's insert-or-find (``Enqueues``);
- results.py: extend, ack, fail and release, what ends or keeps a delivery (``Results``);
- reaper.py: expired leases taken back, and old finished jobs pruned (``Reaper``);
- reads.py: a job, a page of jobs, stats, history, arrivals (``Reads``);
- deadletters.py: list, requeue and purge dead jobs (``DeadLetters``);
- node_table.py: the supervisors' rows and heartbeats (``NodeTable``);
- capped.py: the claim with fleet-wide caps and fair shares (``CappedClaims``), on top of
  fair.py;
- rated.py: the claim of a pool with rate limits, spending its token buckets
  (``RatedClaims``; the arithmetic is supervisor/rates.py);
- schedule_table.py: the schedule rows and their guarded advance (``ScheduleTable``);
- controls.py: cancel, pause and resume, and the filters of bulk actions (``ControlTable``).

Beside them: driver.py, where every verb runs (``driver.translated``, the one place where driver
errors become ``StoreUnavailable``, raised ``from`` the driver's error; and the fast path by
which the uncapped claim and the ack go to the driver's cursor directly); rows.py, a claim's
columns and order, rows as ``Job``, bound values; budget.py, the retry budget's counters,
written by claim and fail.

A job whose cancel was requested while it was leased (``cancel_requested_at``) ends that
delivery ``cancelled`` whichever verb ends it: ack (its result kept), fail, release, reap.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    bindparam,
    case,
    literal,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from supervisor.clock import Clock
from supervisor.model import (
    Claimed,
    ClaimLimits,
    JobState,
    RetryBudget,
)
from supervisor.store import driver, fair, migrations
from supervisor.store.budget import Budgets
from supervisor.store.capped import CappedClaims
from supervisor.store.claim import ClaimRequest
from supervisor.store.controls import ControlTable
from supervisor.store.deadletters import DeadLetters
from supervisor.store.enqueue import Enqueues
from supervisor.store.node_table import NodeTable
from supervisor.store.rated import RatedClaims
from supervisor.store.reads import Reads
from supervisor.store.reaper import Reaper
from supervisor.store.results import LeaseWrites
from supervisor.store.rows import (
    CLAIMED_AT,
    CLAIMED_COLUMNS,
    ClaimRow,
    as_claimed,
    claim_order,
    claim_row,
)
from supervisor.store.rows import TIME as _TIME
from supervisor.store.schedule_table import ScheduleTable
from supervisor.store.schema import jobs
from supervisor.store.wake import CONTROLS_WAKE

QUEUED, LEASED, DONE, DEAD, CANCELLED = (s.value for s in JobState)


class SqlStore(
    Enqueues,
    LeaseWrites,
    Reaper,
    Reads,
    DeadLetters,
    NodeTable,
    CappedClaims,
    RatedClaims,
    ScheduleTable,
    ControlTable,
):
    """The dialect-neutral verbs: the claim here, the others in the mixins, each its own
    module. Subclasses set up the engine and the dialect hooks."""

    dialect = "sql"

    def __init__(self, engine: Engine, clock: Clock | None) -> None:
        # clock None means "the database's own clock" (PostgreSQL in production).
        self.engine = engine
        self._clock = clock

    # ---- plumbing -----------------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite: take the write lock up front)."""
        with driver.translated(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def _auto(self) -> Iterator[Connection]:
        """Autocommit: each statement is its own transaction (one round trip fewer)."""
        with driver.translated(), self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def _now(self) -> ColumnElement[float]:
        """Now as SQL: a parameter filled from the injected clock at execution (see
        ``_exec``), or the database's clock."""
        if self._clock is not None:
            return bindparam("now", type_=_TIME)
        return self._db_now()

    def _exec(self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None) -> Any:
        """Execute with the clock's "now" added (ignored by statements that do not use it)."""
        return conn.execute(stmt, self._with_now(dict(params or {})))

    def _db_now(self) -> ColumnElement[float]:
        raise NotImplementedError

    def _token(self) -> ColumnElement[str]:
        """A fresh random lease token per row, made by the database."""
        raise NotImplementedError

    # Where a fair pool's plain claim tests its guard (``_claim_stmt``). PostgreSQL: in the
    # WHERE, a one-time filter that stops the scan when false (an expression in the LIMIT
    # would hide the limit from the planner, which then hashes the whole table). SQLite: in
    # the LIMIT (0 when false), as a false WHERE term is tested on every row of the pool.
    _guard_in_limit = False

    def _mostly_true(self, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        """Hook: ``condition`` as a planner hint that it holds for most rows (SQLite)."""
        return condition

    def _insert(self) -> Any:
        """The dialect's INSERT construct (with ON CONFLICT support)."""
        raise NotImplementedError

    def _after_enqueue(self, conn: Connection, pools: set[str]) -> None:
        """Hook: wake supervisors waiting for work in ``pools`` (PostgreSQL NOTIFY)."""

    def _announce(self, pools: set[str]) -> None:
        """Wake supervisors waiting for work in ``pools``, outside any transaction. Best
        effort: a lost wake-up costs one poll interval."""

    def _after_commit(self, pools: set[str]) -> None:
        """Hook: wake local supervisors once the new jobs are visible (SQLite)."""

    def _finals_in_tx(self, conn: Connection, ids: Sequence[int]) -> None:
        """Hook: tell waiters, inside the transaction that made ``ids`` final, once it
        commits (PostgreSQL NOTIFY; supervisor/store/finals.py)."""

    def _finals_committed(self, ids: Sequence[int]) -> None:
        """Hook: tell waiters on this host that ``ids`` are final, after the commit (SQLite)."""

    def final_watch(self, within: float = math.inf) -> Any:
        """A waiter's registration for final states (``finals.LocalFinalWatch`` or
        ``PostgresFinalWatch``: ``wait(timeout)``, ``broken``, ``close()``), made before the
        waiter's first read, in at most about ``within`` s; None when this store cannot be
        told (the waiter polls)."""
        return None

    def _announce_controls(self) -> None:
        """Have every supervisor read the controls now (a cancel, a pause, a resume): the
        wake-up channel with a name no pool can have. Best effort: they read them every
        ``CONTROLS_EVERY`` anyway."""
        self._announce({CONTROLS_WAKE})

    def waker(self) -> Any:
        """A ``Waker`` for the supervisor's loop, or None when this engine has none."""
        return None

    def migrate(self) -> int:
        """Bring the schema up to date; return its version."""
        with self._tx() as conn:
            self._lock_for_migration(conn)
            return migrations.migrate(conn, self.engine.dialect.name, self.now())

    def _lock_for_migration(self, conn: Connection) -> None:
        """SQLite's BEGIN IMMEDIATE already serialises; PostgreSQL takes an advisory lock."""

    def now(self) -> float:
        """The store's clock as a Python value."""
        if self._clock is not None:
            return self._clock.now()
        with self._auto() as conn:
            return float(conn.execute(select(self._db_now())).scalar_one())

    def close(self) -> None:
        self.engine.dispose()

    def _with_now(self, params: dict[str, Any]) -> dict[str, Any]:
        if self._clock is not None:
            pinned = self.__dict__.get("_pinned_now")
            params["now"] = self._clock.now() if pinned is None else pinned
        return params

    @contextmanager
    def _one_now(self, now: float) -> Iterator[None]:
        """Every statement inside reads ``now`` as the injected clock's time (a transaction
        whose statements must agree on it, as PostgreSQL's ``now()`` does: rated.py)."""
        self._pinned_now: float | None = now
        try:
            yield
        finally:
            self._pinned_now = None

    # ---- claim and the lease ------------------------------------------------------------

    def claim(
        self,
        *,
        pool: str,
        kinds: Collection[str],
        n: int,
        node: str,
        lease: float,
        limits: ClaimLimits | None = None,
        budget: RetryBudget | None = None,
        finished: Mapping[str, int] | None = None,
    ) -> list[Claimed]:
        """Lease up to ``n`` ready jobs of ``pool`` whose kind is in ``kinds``, highest
        priority first, then longest waiting. Counts a delivery on each (and in the pool's
        retry ``budget``, when it has one). With capped ``limits``, stays within the pool's,
        tenants' and kinds' fleet-wide caps and orders fairly between tenants
        (``CappedClaims``, supervisor/store/capped.py and fair.py); with ``limits.fair``,
        orders fairly between tenants whenever more than one is queued. ``finished``: per
        tenant, this node's jobs of the pool that ended but whose results are not written
        yet; the fair order does not count them as running (caps still do). The keywords are
        a ``ClaimRequest``'s fields (supervisor/store/claim.py), built here for tests and
        tools; the supervisor's loop sends the request itself to ``claim_rows``."""
        request = ClaimRequest(pool, kinds, n, node, lease, limits, budget, finished)
        return [as_claimed(r) for r in self.claim_rows(request)]

    def claim_rows(self, claim: ClaimRequest) -> list[ClaimRow]:
        """``claim``, its jobs as ``ClaimRow`` tuples in claim order: what a store process
        sends to its loop, without building objects it would take apart again."""
        if claim.n <= 0 or not claim.kinds:
            return []
        pool, limits = claim.pool, claim.limits
        if limits is not None and limits.capped:
            return self._claim_capped(claim, limits)
        # fair: the plain claim, guarded to take nothing while more than one tenant queues
        # (one index probe each way); then, and only then, the fair claim (fair.py). A pool
        # found mixed goes straight to the fair claim until a fair claim's window holds one
        # tenant or none: which to try first is all the flag decides, both are right always.
        # A guarded claim that took jobs found one tenant queued: for ``fair.GUARD_EVERY``
        # the pool's claims run the bare plain statement (the guard was a sixth of a SQLite
        # claim); a tenant that arrives meanwhile is ordered fairly at most that much later
        by_tenant = limits is not None and limits.fair
        if by_tenant and pool in self._mixed_pools:
            assert limits is not None
            return self._claim_fair(claim, limits)
        at_mono = self._monotonic()
        guarded = by_tenant and not fair.one_tenant_known(self._one_tenant_at.get(pool), at_mono)
        raw, params = self._plain_claim(
            pool, claim.kinds, claim.n, claim.node, claim.lease, one_tenant=guarded
        )
        budget = claim.budget
        with self._auto() as conn:
            rows = driver.fetchall(conn, raw, params)
            mixed = guarded and not rows and self._mixed(conn, pool)
            if budget is not None and rows:
                at = rows[0][CLAIMED_AT]
                self._budgets.count_deliveries(conn, pool, budget, len(rows), at)
        if guarded and rows:
            self._one_tenant_at[pool] = at_mono
        if mixed:
            assert limits is not None
            self._mixed_pools.add(pool)
            return self._claim_fair(claim, limits)
        rows.sort(key=claim_order)
        return [claim_row(r) for r in rows]

    def _claim_fair(self, claim: ClaimRequest, limits: ClaimLimits) -> list[ClaimRow]:
        """The fair claim of an uncapped pool (capped.py's transaction, no caps to keep)."""
        pool = claim.pool
        cursor = self._cursors.get(pool)
        rows = self._claim_capped(claim, limits)
        if self._widths.get(pool, 0) <= 1:  # its window saw one tenant queued, or none:
            self._mixed_pools.discard(pool)  # the plain claim's turn, which keeps the cursor
            self._cursors[pool] = cursor
        return rows

    @cached_property
    def _one_tenant_at(self) -> dict[str, float]:
        """Per pool: when (monotonic) a guarded plain claim last took jobs, so found one
        tenant queued (per store: per host)."""
        return {}

    def _monotonic(self) -> float:
        return self._clock.monotonic() if self._clock is not None else time.monotonic()

    @cached_property
    def _mixed_pools(self) -> set[str]:
        """Pools whose last look found more than one tenant queued (per store: per host)."""
        return set()

    def _mixed(self, conn: Connection, pool: str) -> bool:
        """Whether the pool's queue holds jobs of more than one tenant (two index probes)."""
        return bool(conn.execute(self._mixed_stmt, {"c_pool": pool}).scalar())

    @cached_property
    def _mixed_stmt(self) -> Any:
        return select(fair.tenants_differ())

    @cached_property
    def _budgets(self) -> Budgets:
        return Budgets(self._insert(), self._now(), self._exec)

    def _lease_values(self) -> dict[str, Any]:
        """What a claim writes on each job it leases."""
        now = self._now()
        return {
            "state": LEASED,
            "owner": bindparam("c_node"),
            "lease_token": self._token(),
            "locked_until": now + bindparam("c_lease", type_=_TIME),
            "attempts": jobs.c.attempts + 1,
            "extensions": 0,
            "started_at": now,
            "finished_at": None,
        }

    def claim_statement(
        self,
        *,
        pool: str,
        kinds: Collection[str],
        n: int,
        node: str,
        lease: float,
        one_tenant: bool = False,
    ) -> tuple[str, Any]:
        """The SQL and driver parameters of an uncapped ``claim`` (for EXPLAIN, in
        benchmarks and tests: it does not pass through SQLAlchemy's execute events);
        ``one_tenant``: the fair pool's guarded form."""
        raw, params = self._plain_claim(pool, kinds, n, node, lease, one_tenant=one_tenant)
        return raw.sql, raw.rows([params])[0]

    def _plain_claim(
        self,
        pool: str,
        kinds: Collection[str],
        n: int,
        node: str,
        lease: float,
        *,
        one_tenant: bool = False,
    ) -> tuple[driver.Raw, dict[str, Any]]:
        params = {"c_pool": pool, "c_n": n, "c_node": node, "c_lease": lease}
        params.update((f"c_kind{i}", kind) for i, kind in enumerate(sorted(kinds)))
        return self._claim_raw(len(kinds), one_tenant), self._with_now(params)

    def _claim_raw(self, n_kinds: int, one_tenant: bool = False) -> driver.Raw:
        """The claim for a pool of ``n_kinds`` kinds, compiled once: claiming is most of a
        short job's cost, and SQLAlchemy's per-call compile-cache lookup, parameter and
        result processing took half of it (the driver's rows are what the claim needs).
        ``one_tenant``: the form a fair pool runs, which takes nothing while jobs of more
        than one tenant are queued."""
        raw = self._claim_raws.get((n_kinds, one_tenant))
        if raw is None:
            stmt = self._claim_stmt(n_kinds, one_tenant)
            raw = driver.Raw.of(stmt, self.engine.dialect)
            self._claim_raws[(n_kinds, one_tenant)] = raw
        return raw

    @cached_property
    def _claim_raws(self) -> dict[tuple[int, bool], driver.Raw]:
        return {}

    def _claim_stmt(self, n_kinds: int, one_tenant: bool = False) -> Any:
        now = self._now()
        # a fair pool's guard: the lowest and the highest tenant queued are one, found by one
        # index probe each (both NULL, so false, when nothing is queued). Evaluated once, when
        # the statement starts; a tenant that arrives after it waits for the next claim
        guard, limit = [], bindparam("c_n", type_=Integer)
        if one_tenant and self._guard_in_limit:
            limit = case((fair.one_tenant(), limit), else_=literal(0, Integer))
        elif one_tenant:
            guard = [fair.one_tenant()]
        ready = (
            select(jobs.c.id)
            .where(
                jobs.c.pool == bindparam("c_pool"),
                jobs.c.state == QUEUED,
                self._mostly_true(jobs.c.available_at <= now),
                jobs.c.kind.in_([bindparam(f"c_kind{i}") for i in range(n_kinds)]),
                *guard,
            )
            .order_by(jobs.c.priority.desc(), jobs.c.available_at, jobs.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return (
            update(jobs)
            .where(jobs.c.id.in_(ready.scalar_subquery()))
            .values(self._lease_values())
            .returning(*CLAIMED_COLUMNS)
        )
