"""``SqlStore``: the lease state machine's verbs in SQLAlchemy Core, shared by both dialects.

Every verb is one transaction (or one autocommit statement), so a crash or an outage between
verbs leaves the queue in a state the verbs already know. Every write after a claim is guarded by
state and lease token in its WHERE clause and reports which rows it changed: a late ack from a
worker whose lease was taken over changes nothing and comes back as lost.

Dialects differ only where they must (``SqliteStore``, ``PostgresStore``): how "now" is read, how
a lease token is made, connection set-up, and the wake-up channel. Around the verbs:

- driver.py: every verb runs inside ``driver.translated``, the one place where driver errors
  become ``StoreUnavailable`` (raised ``from`` the driver's error), and the uncapped claim and
  the ack go to the driver's cursor directly;
- rows.py: a claim's columns and order, rows as ``Job``, bound values;
- capped.py: the claim with fleet-wide caps and fair shares (``CappedClaims``, a mixin of this
  class), on top of fair.py;
- rated.py: the claim of a pool with rate limits, spending its token buckets
  (``RatedClaims``, a mixin; the arithmetic is supervisor/rates.py);
- budget.py: the retry budget's counters, written by claim and fail;
- schedule_table.py: the schedule rows and their guarded advance (``ScheduleTable``, a mixin);
- controls.py: cancel, pause and resume, and the filters of bulk actions (``ControlTable``).

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
    BigInteger,
    Connection,
    Engine,
    Float,
    Integer,
    String,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from supervisor.clock import Clock
from supervisor.errors import JobNotFound, NotDead
from supervisor.model import (
    STATS_CAP,
    Ack,
    Claimed,
    ClaimLimits,
    ErrorKind,
    FailOutcome,
    Failure,
    Job,
    JobFilter,
    JobState,
    Lease,
    NewJob,
    PoolHistory,
    PoolStats,
    ReapOutcome,
    RetryBudget,
)
from supervisor.store import driver, fair, migrations
from supervisor.store.budget import Budgets
from supervisor.store.capped import CappedClaims
from supervisor.store.claim import ClaimRequest
from supervisor.store.controls import ControlTable
from supervisor.store.rated import RatedClaims
from supervisor.store.rows import (
    CLAIMED_AT,
    CLAIMED_COLUMNS,
    LEASES_MATCH,
    ClaimRow,
    as_claimed,
    as_job,
    chunks,
    claim_order,
    claim_row,
    job_params,
    lease_pairs,
)
from supervisor.store.schedule_table import ScheduleTable
from supervisor.store.schema import KEYED, jobs, nodes
from supervisor.store.wake import CONTROLS_WAKE

QUEUED, LEASED, DONE, DEAD, CANCELLED = (s.value for s in JobState)
_TIME = Float(precision=53)

# Which of the given leases are still valid, their rows locked (``SqlStore._owned``)
_OWNED_STMT = (
    select(jobs.c.id, jobs.c.lease_token)
    .where(jobs.c.state == LEASED, LEASES_MATCH)
    .with_for_update()
)


class _Partial(Exception):
    """Inside the store only: a batched write did not take for every row; roll it back."""


# A delivery whose cancel was requested ends cancelled, whatever ended it (controls.py)
CANCEL_ASKED = jobs.c.cancel_requested_at.is_not(None)


class SqlStore(CappedClaims, RatedClaims, ScheduleTable, ControlTable):
    """The dialect-neutral verbs. Subclasses set up the engine and the dialect hooks."""

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

    # ---- enqueue ------------------------------------------------------------------------

    def enqueue(self, job: NewJob) -> int:
        """Add one job; an existing (kind, key) returns that job's id and changes nothing."""
        return self.enqueue_many([job])[0]

    def enqueue_many(self, new: Sequence[NewJob]) -> list[int]:
        """Add jobs in one transaction; ids come back in input order."""
        if not new:
            return []
        with self._tx() as conn:
            ids = self._insert_plain(conn, [j for j in new if j.key is None])
            plain = iter(ids)
            out = [next(plain) if j.key is None else self._insert_keyed(conn, j) for j in new]
            self._after_enqueue(conn, {j.pool for j in new})
        self._after_commit({j.pool for j in new})
        return out

    def _row_values(self) -> dict[str, Any]:
        now = self._now()
        names = ("kind", "pool", "payload", "tenant", "key", "priority", "max_deliveries")
        values: dict[str, Any] = {n: bindparam(n) for n in names}
        values.update(
            state=QUEUED,
            enqueued_at=now,
            available_at=now + bindparam("delay", type_=_TIME),
        )
        return values

    def _insert_plain(self, conn: Connection, new: list[NewJob]) -> list[int]:
        if not new:
            return []
        rows = [self._with_now(job_params(j)) for j in new]
        return list(conn.execute(self._insert_stmt, rows).scalars())

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

    @cached_property
    def _insert_stmt(self) -> Any:
        stmt = insert(jobs).values(self._row_values())
        return stmt.returning(jobs.c.id, sort_by_parameter_order=True)

    @cached_property
    def _insert_keyed_stmt(self) -> Any:
        stmt = self._insert()(jobs).values(self._row_values())
        keyed = stmt.on_conflict_do_nothing(index_elements=["kind", "key"], index_where=text(KEYED))
        return keyed.returning(jobs.c.id)

    def _insert_keyed(self, conn: Connection, job: NewJob) -> int:
        return self._insert_or_find(conn, job)[0]

    def _insert_or_find(self, conn: Connection, job: NewJob) -> tuple[int, bool]:
        """The keyed job's id, and whether this inserted it (False: the key named a job that
        was there already, which is returned unchanged)."""
        inserted = self._exec(conn, self._insert_keyed_stmt, job_params(job)).scalar()
        if inserted is not None:
            return int(inserted), True
        found = select(jobs.c.id).where(jobs.c.kind == job.kind, jobs.c.key == job.key)
        return int(conn.execute(found).scalar_one()), False

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

    def extend(self, leases: Sequence[Lease], *, lease: float) -> list[Lease]:
        """Push the leases' expiry to now + ``lease`` (a statement per ``BATCH``); return the
        leases NOT extended (lost: taken over, reaped or finished) so their workers can be
        killed."""
        if not leases:
            return []
        kept: set[Lease] = set()
        with self._auto() as conn:  # a statement a chunk: a host holds thousands at most
            for part in chunks(leases):
                params = {"leases": lease_pairs(part), "lease": lease}
                kept.update(
                    Lease(r.id, r.lease_token) for r in self._exec(conn, self._extend_stmt, params)
                )
        return [lease_ for lease_ in leases if lease_ not in kept]

    @cached_property
    def _extend_stmt(self) -> Any:
        return (
            update(jobs)
            .where(jobs.c.state == LEASED, LEASES_MATCH)
            .values(
                locked_until=self._now() + bindparam("lease", type_=_TIME),
                extensions=jobs.c.extensions + 1,
            )
            .returning(jobs.c.id, jobs.c.lease_token)
        )

    def ack(self, acks: Sequence[Ack]) -> list[Lease]:
        """Mark jobs done with their results; return the leases that were no longer ours
        (nothing changed for those). Each row's update is guarded by its lease, so one
        executemany usually does it; only when fewer rows changed than acks were given is it
        rolled back and redone knowing which leases are still ours."""
        if not acks:
            return []
        now = self._clock.now() if self._clock is not None else None
        params = [
            {
                "b_id": a.lease.job_id,
                "b_token": a.lease.token,
                "b_result": a.result,
                "b_peak_rss": a.peak_rss,
                "b_duration": a.duration,
                "now": now,
            }
            for a in acks
        ]
        ids = [a.lease.job_id for a in acks]
        try:
            with self._tx() as conn:
                changed = driver.executemany(conn, self._ack_raw, params)
                if changed != len(acks) or not conn.dialect.supports_sane_multi_rowcount:
                    raise _Partial  # roll back, and redo it row by row below
                self._finals_in_tx(conn, ids)
            self._finals_committed(ids)
            return []
        except _Partial:
            pass
        with self._tx() as conn:
            owned = self._owned(conn, [a.lease for a in acks])
            mine = [p for p, a in zip(params, acks, strict=True) if a.lease in owned]
            if mine:
                conn.execute(self._ack_stmt, mine)
                self._finals_in_tx(conn, [p["b_id"] for p in mine])
        self._finals_committed([p["b_id"] for p in mine])
        return [a.lease for a in acks if a.lease not in owned]

    def _owned(self, conn: Connection, leases: Sequence[Lease]) -> set[Lease]:
        """Those of ``leases`` still valid (job leased under that token), their rows locked for
        this transaction (SQLite's write lock is already held; PostgreSQL locks the rows)."""
        owned: set[Lease] = set()
        for part in chunks(leases):
            rows = conn.execute(_OWNED_STMT, {"leases": lease_pairs(part)})
            owned.update(Lease(r.id, r.lease_token) for r in rows)
        return owned

    @cached_property
    def _ack_raw(self) -> driver.Raw:
        return driver.Raw.of(self._ack_stmt, self.engine.dialect)

    @cached_property
    def _ack_stmt(self) -> Any:
        return (
            update(jobs)
            .where(
                jobs.c.id == bindparam("b_id"),
                jobs.c.lease_token == bindparam("b_token"),
                jobs.c.state == LEASED,
            )
            .values(
                state=case((CANCEL_ASKED, CANCELLED), else_=DONE),
                result=bindparam("b_result"),
                peak_rss=bindparam("b_peak_rss"),
                duration=bindparam("b_duration"),
                finished_at=self._now(),
                owner=None,
                locked_until=None,
            )
        )

    def fail(self, failures: Sequence[Failure]) -> FailOutcome:
        """Record failed deliveries: retry after ``retry_delay`` while attempts remain,
        otherwise (or when ``retry_delay`` is None) dead-letter. A failure with a retry
        ``budget`` that is spent is deferred instead (supervisor/store/budget.py)."""
        retried: list[int] = []
        dead: list[int] = []
        cancelled: list[int] = []
        lost: list[Lease] = []
        with self._tx() as conn:
            deferred = self._budgets.judge(conn, failures)
            for f in failures:
                stmt = self._dead_stmt if f.retry_delay is None else self._retry_stmt
                deferral = deferred.get(f.lease.job_id)
                params = {
                    "leases": [(f.lease.job_id, f.lease.token)],
                    "f_delay": deferral.delay if deferral else f.retry_delay or 0.0,
                    "f_error_kind": None if f.error_kind is None else str(f.error_kind),
                    "f_message": deferral.message if deferral else f.message,
                    "f_peak_rss": f.peak_rss,
                    "f_duration": f.duration,
                }
                row = self._exec(conn, stmt, params).first()
                if row is None:
                    lost.append(f.lease)
                else:
                    ended = {DEAD: dead, CANCELLED: cancelled}.get(row.state, retried)
                    ended.append(row.id)
            self._finals_in_tx(conn, dead + cancelled)
        self._finals_committed(dead + cancelled)
        later = tuple(i for i in retried if i in deferred)
        return FailOutcome(tuple(retried), tuple(dead), tuple(lost), later, tuple(cancelled))

    @cached_property
    def _retry_stmt(self) -> Any:
        return self._fail_statement(jobs.c.attempts >= jobs.c.max_deliveries)

    @cached_property
    def _dead_stmt(self) -> Any:
        return self._fail_statement(literal(True))

    def _fail_statement(self, at_limit: ColumnElement[bool]) -> Any:
        now = self._now()
        return (
            update(jobs)
            .where(jobs.c.state == LEASED, LEASES_MATCH)
            .values(
                state=case((CANCEL_ASKED, CANCELLED), (at_limit, DEAD), else_=QUEUED),
                available_at=case(
                    (CANCEL_ASKED | at_limit, jobs.c.available_at),
                    else_=now + bindparam("f_delay", type_=_TIME),
                ),
                finished_at=case((CANCEL_ASKED | at_limit, now), else_=None),
                error_kind=bindparam("f_error_kind"),
                last_error=bindparam("f_message"),
                peak_rss=bindparam("f_peak_rss", type_=BigInteger),
                duration=bindparam("f_duration", type_=_TIME),
                owner=None,
                locked_until=None,
            )
            .returning(jobs.c.id, jobs.c.state)
        )

    def release(self, leases: Sequence[Lease]) -> list[int]:
        """Hand jobs back untouched: visible at once, this delivery not counted. Returns the
        ids released (a lease no longer ours is skipped)."""
        if not leases:
            return []
        with self._tx() as conn:  # a transaction: a cancelled job's wake-up goes in it
            rows = [
                row
                for part in chunks(leases)
                for row in self._exec(conn, self._release_stmt, {"leases": lease_pairs(part)})
            ]
            ended = [r.id for r in rows if r.state == CANCELLED]
            self._finals_in_tx(conn, ended)
        self._finals_committed(ended)
        if any(r.state == QUEUED for r in rows):  # idle supervisors take them at once
            self._announce({r.pool for r in rows if r.state == QUEUED})
        return sorted(r.id for r in rows)

    @cached_property
    def _release_stmt(self) -> Any:
        return (
            update(jobs)
            .where(jobs.c.state == LEASED, LEASES_MATCH)
            .values(
                state=case((CANCEL_ASKED, CANCELLED), else_=QUEUED),
                attempts=jobs.c.attempts - 1,
                available_at=self._now(),
                finished_at=case((CANCEL_ASKED, self._now()), else_=None),
                owner=None,
                locked_until=None,
                lease_token=None,
            )
            .returning(jobs.c.id, jobs.c.pool, jobs.c.state)
        )

    def reap(self, *, limit: int = 1000) -> ReapOutcome:
        """Expired leases back to queued, or dead when the delivery limit is reached (recorded
        as ``lease_expired``). Safe to run on every node at once."""
        with self._tx() as conn:  # a transaction: the wake-up of jobs it ended goes in it
            rows = self._exec(conn, self._reap_stmt, {"limit": limit}).all()
            ended = [r.id for r in rows if r.state in (DEAD, CANCELLED)]
            self._finals_in_tx(conn, ended)
        self._finals_committed(ended)
        requeued = tuple(sorted(r.id for r in rows if r.state == QUEUED))
        dead = tuple(sorted(r.id for r in rows if r.state == DEAD))
        cancelled = tuple(sorted(r.id for r in rows if r.state == CANCELLED))
        return ReapOutcome(requeued, dead, {r.id: r.attempts for r in rows}, cancelled)

    @cached_property
    def _reap_stmt(self) -> Any:
        now = self._now()
        expired = (
            select(jobs.c.id)
            .where(jobs.c.state == LEASED, jobs.c.locked_until < now)
            .limit(bindparam("limit", type_=Integer))
            .with_for_update(skip_locked=True)
        )
        at_limit = jobs.c.attempts >= jobs.c.max_deliveries
        message = (
            literal("the lease held by node ", String)
            + func.coalesce(jobs.c.owner, "?")
            + literal(" expired during attempt ", String)
            + cast(jobs.c.attempts, String)
        )
        return (
            update(jobs)
            .where(jobs.c.id.in_(expired.scalar_subquery()))
            .values(
                state=case((CANCEL_ASKED, CANCELLED), (at_limit, DEAD), else_=QUEUED),
                finished_at=case((CANCEL_ASKED | at_limit, now), else_=None),
                available_at=now,
                error_kind=ErrorKind.LEASE_EXPIRED.value,
                last_error=message,
                owner=None,
                locked_until=None,
            )
            .returning(jobs.c.id, jobs.c.state, jobs.c.attempts)
        )

    # ---- reading ------------------------------------------------------------------------

    def get(self, job_id: int) -> Job | None:
        with self._auto() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        return None if row is None else as_job(row)

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        pool: str | None = None,
        limit: int = 100,
        after_id: int = 0,
    ) -> list[Job]:
        """Jobs by id, optionally of one state and pool, starting after ``after_id``."""
        query = select(jobs).where(jobs.c.id > after_id).order_by(jobs.c.id).limit(limit)
        if state is not None:
            query = query.where(jobs.c.state == str(state))
        if pool is not None:
            query = query.where(jobs.c.pool == pool)
        with self._auto() as conn:
            return [as_job(r) for r in conn.execute(query)]

    def stats(self, pools: Collection[str]) -> dict[str, PoolStats]:
        """Per-pool figures. Each count walks only the partial index of its state, and the
        oldest-ready query reads one index entry."""
        now = self._now()
        with self._auto() as conn:
            return {p: self._pool_stats(conn, p, now) for p in pools}

    def _pool_stats(self, conn: Connection, pool: str, now: ColumnElement[float]) -> PoolStats:
        in_pool = jobs.c.pool == pool
        queued = and_(in_pool, jobs.c.state == QUEUED)
        oldest, now_value = self._exec(
            conn, select(func.min(jobs.c.available_at), now).where(queued)
        ).one()
        ready = 0
        if oldest is not None and oldest <= now_value:
            ready = self._capped(conn, and_(queued, jobs.c.available_at <= now))
        counts = {
            state: self._capped(conn, and_(in_pool, jobs.c.state == state))
            for state in (QUEUED, LEASED, DONE, DEAD, CANCELLED)
        }
        return PoolStats(
            pool=pool,
            ready=ready,
            scheduled=max(0, counts[QUEUED] - ready),
            leased=counts[LEASED],
            done=counts[DONE],
            dead=counts[DEAD],
            cancelled=counts[CANCELLED],
            oldest_ready_age=max(0.0, now_value - oldest) if ready else 0.0,
            capped=max(ready, *counts.values()) >= STATS_CAP,
        )

    def _capped(self, conn: Connection, where: ColumnElement[bool]) -> int:
        """count(*) of the rows matching ``where``, stopping at STATS_CAP: each walks at
        most that many entries of the index its state's condition fits."""
        inner = select(literal(1)).where(where).limit(STATS_CAP).subquery()
        return int(self._exec(conn, select(func.count()).select_from(inner)).scalar_one())

    def history(self, pool: str, *, window: float, sample: int = 500) -> PoolHistory:
        """Jobs of ``pool`` done in the last ``window`` seconds (the done-jobs index by
        finish time): their count, and durations and peaks of the latest ``sample``."""
        since = self._now() - window
        recent = and_(jobs.c.pool == pool, jobs.c.state == DONE, jobs.c.finished_at >= since)
        latest = (
            select(jobs.c.duration, jobs.c.peak_rss)
            .where(recent)
            .order_by(jobs.c.finished_at.desc())
            .limit(sample)
        )
        with self._auto() as conn:
            count = self._exec(conn, select(func.count()).where(recent)).scalar_one()
            rows = self._exec(conn, latest).all()
        return PoolHistory(
            completed=count,
            durations=tuple(r.duration for r in rows if r.duration is not None),
            peaks=tuple(r.peak_rss for r in rows if r.peak_rss is not None),
        )

    # ---- dead letters and retention -----------------------------------------------------

    def dlq_list(self, *, pool: str | None = None, limit: int = 100) -> list[Job]:
        return self.list_jobs(state=JobState.DEAD, pool=pool, limit=limit)

    def dlq_requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        pool: str | None = None,
        where: JobFilter | None = None,
    ) -> list[int]:
        """Give dead jobs a fresh delivery budget. ``ids`` None means every dead job (of
        ``pool``, and matching ``where``). Naming a job that is missing or not dead changes
        nothing and raises."""
        with self._tx() as conn:
            target = self._dead_ids(conn, ids, pool, where)
            for chunk in chunks(target):
                self._exec(
                    conn,
                    update(jobs)
                    .where(jobs.c.id.in_(chunk), jobs.c.state == DEAD)
                    .values(state=QUEUED, attempts=0, available_at=self._now(), finished_at=None),
                )
        return target

    def dlq_purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        pool: str | None = None,
        where: JobFilter | None = None,
    ) -> list[int]:
        """Delete dead jobs (all of them, or of ``pool`` and matching ``where``, or exactly
        ``ids``); returns the ids deleted, in order."""
        purged: list[int] = []
        with self._tx() as conn:
            target = self._dead_ids(conn, ids, pool, where)
            for chunk in chunks(target):
                stmt = delete(jobs).where(jobs.c.id.in_(chunk), jobs.c.state == DEAD)
                purged.extend(conn.execute(stmt.returning(jobs.c.id)).scalars())
        return sorted(purged)

    def _dead_ids(
        self,
        conn: Connection,
        ids: Sequence[int] | None,
        pool: str | None,
        where: JobFilter | None = None,
    ) -> list[int]:
        if ids is None:
            cond = self.matching(where or JobFilter(), [JobState.DEAD])
            query = select(jobs.c.id).where(cond).order_by(jobs.c.id)
            if pool is not None:
                query = query.where(jobs.c.pool == pool)
            return list(self._exec(conn, query).scalars())
        wanted = sorted(set(ids))
        states: dict[int, str] = {}
        for chunk in chunks(wanted):
            query = select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(chunk))
            states.update((r.id, r.state) for r in conn.execute(query))
        missing = [i for i in wanted if i not in states]
        if missing:
            raise JobNotFound(f"no job with id {', '.join(map(str, missing))}")
        alive = [f"{i} ({states[i]})" for i in wanted if states[i] != DEAD]
        if alive:
            raise NotDead(f"not dead, so not in the dead-letter queue: job {', '.join(alive)}")
        return wanted

    def prune(self, *, older_than: float, batch: int = 5000) -> int:
        """Delete done and cancelled jobs that finished more than ``older_than`` seconds ago,
        in batches so no transaction holds the write lock for long (each state through its
        own partial index)."""
        total = 0
        for state in (DONE, CANCELLED):
            while True:
                cutoff = self._now() - older_than
                old = (
                    select(jobs.c.id)
                    .where(jobs.c.state == state, jobs.c.finished_at < cutoff)
                    .limit(batch)
                )
                with self._auto() as conn:
                    removed = self._exec(
                        conn, delete(jobs).where(jobs.c.id.in_(old.scalar_subquery()))
                    )
                total += removed.rowcount
                if removed.rowcount < batch:
                    break
        return total

    # ---- nodes --------------------------------------------------------------------------

    def register_node(self, *, node_id: str, hostname: str, pid: int, fleet: str) -> None:
        """Record this supervisor as running (replacing an earlier row of the same id)."""
        now = self._now()
        with self._tx() as conn:
            conn.execute(delete(nodes).where(nodes.c.node_id == node_id))
            self._exec(
                conn,
                insert(nodes).values(
                    node_id=node_id,
                    hostname=hostname,
                    pid=pid,
                    fleet=fleet,
                    started_at=now,
                    heartbeat_at=now,
                    state="running",
                ),
            )

    def node_heartbeat(self, node_id: str, *, state: str, snapshot: str | None) -> None:
        """Refresh this node's heartbeat, state and status snapshot."""
        stmt = (
            update(nodes)
            .where(nodes.c.node_id == node_id)
            .values(heartbeat_at=self._now(), state=state, snapshot=snapshot)
        )
        with self._auto() as conn:
            self._exec(conn, stmt)

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node row, with ``age``: seconds since its last heartbeat (by the store's clock)."""
        query = select(nodes, (self._now() - nodes.c.heartbeat_at).label("age")).order_by(
            nodes.c.node_id
        )
        with self._auto() as conn:
            return [dict(r._mapping) for r in self._exec(conn, query)]

    def arrivals(self, *, after_id: int | None) -> tuple[dict[str, int], int]:
        """Jobs enqueued after job ``after_id``, per pool, and the highest id now (ids only
        grow and are never reused, so this reads only the new rows, by primary key). With
        ``after_id`` None only the highest id is read: counting starts now. On PostgreSQL a
        row whose transaction commits after a higher id was read is not counted (a slight
        undercount under concurrent enqueues; fine for a rate)."""
        top = select(func.coalesce(func.max(jobs.c.id), 0))
        with self._auto() as conn:
            if after_id is None:
                return {}, int(self._exec(conn, top).scalar_one())
            rows = self._exec(
                conn,
                select(jobs.c.pool, func.count(), func.max(jobs.c.id))
                .where(jobs.c.id > after_id)
                .group_by(jobs.c.pool),
            ).all()
        counts = {pool: int(n) for pool, n, _ in rows}
        return counts, max([after_id, *(int(m) for _, _, m in rows)])
