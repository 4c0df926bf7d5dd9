"""The fleet-wide retry budget: per-pool counters in the database, shared by every host.

``fleetd_retry_budget`` holds one row per (pool, bucket), a bucket being ``BUDGET_BUCKET`` (10 s)
of the store's clock. A claim of a pool with a budget adds its deliveries to the current
bucket; ``fail`` reads the sums over the budget's window, lets a failure retry at once while
``RetryBudget.allows`` it (adding to ``retries``), and otherwise defers it (adding to
``deferred``): the job goes back to the queue with ``window`` + its normal delay and a
``last_error`` that says so. Never dropped: a deferred job keeps its attempts and is delivered
again later, when the retries that filled the budget have aged out of the window; it goes dead
only as any job does, at max_deliveries.

What is counted, and what is not:

- deliveries: every job a claim leases (first deliveries and redeliveries alike);
- retries: failures sent back to the queue with their normal delay while the budget allowed;
- deferred: failures past the budget (counted for the record, not against the budget);
- not counted: dead-letters (nothing is retried), releases (not a delivery), and the reaper's
  requeues after an expired lease (a host died: not the downstream failing).

Counters are written in the transaction of the verb they count, so they are as durable as it.
Old buckets are deleted by the claim path, at most once per bucket per pool and store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import Connection, and_, bindparam, delete, func, select, tuple_
from sqlalchemy.sql.elements import ColumnElement

from supervisor.model import Failure, JobState, RetryBudget
from supervisor.store.rows import chunks, lease_pairs
from supervisor.store.schema import BUDGET_BUCKET, jobs, retry_budget

Execute = Callable[..., Any]  # SqlStore._exec: execute with the clock's "now" filled in

DEFERRED = "retry deferred: pool retry budget exhausted"


def bucket_of(now: float) -> int:
    """The bucket a moment falls in."""
    return math.floor(now / BUDGET_BUCKET)


def window_buckets(window: float) -> int:
    """Buckets that make up a window (the current one, partly filled, included)."""
    return max(1, math.ceil(window / BUDGET_BUCKET))


@dataclass(frozen=True, slots=True)
class Deferral:
    """A failure the budget turned away: its new delay and last_error."""

    delay: float
    message: str


class Budgets:
    """The budget's statements, and the two places the verbs use them. ``insert`` is the
    dialect's INSERT construct (ON CONFLICT), ``now`` the store's clock as SQL."""

    def __init__(self, insert: Any, now: ColumnElement[float], execute: Execute) -> None:
        self._insert = insert
        self._now = now
        self._execute = execute
        self._pruned: dict[str, int] = {}  # pool -> the bucket it was last pruned in

    # ---- claim: deliveries ------------------------------------------------------------

    def count_deliveries(
        self, conn: Connection, pool: str, budget: RetryBudget, delivered: int, at: float
    ) -> None:
        """Add ``delivered`` deliveries at ``at`` (the claim's "now") to the pool's bucket."""
        if delivered <= 0:
            return
        bucket = bucket_of(at)
        self._add(conn, pool, bucket, deliveries=delivered)
        if self._pruned.get(pool) != bucket:
            since = bucket - window_buckets(budget.window)
            conn.execute(self._prune_stmt, {"b_pool": pool, "b_before": since})
            self._pruned[pool] = bucket

    # ---- fail: retries or deferrals ---------------------------------------------------

    def judge(self, conn: Connection, failures: Sequence[Failure]) -> dict[int, Deferral]:
        """Decide, for each failure that would be retried under a budget, whether it may retry
        now; count the outcome; return the deferrals by job id. Failures without a budget,
        permanent ones, stale leases and jobs at their last delivery are not judged."""
        judged = [f for f in failures if f.budget is not None and f.retry_delay is not None]
        if not judged:
            return {}
        rows = {
            r.id: r
            for part in chunks(judged)  # a statement per BATCH: each binds two values a lease
            for r in self._execute(
                conn,
                self._targets_stmt,
                {"leases": lease_pairs([f.lease for f in part])},
            )
        }
        windows: dict[str, _Window] = {}
        deferrals: dict[int, Deferral] = {}
        for f in judged:
            row = rows.get(f.lease.job_id)
            if row is None or row.lease_token != f.lease.token or row.at_limit:
                continue
            assert f.budget is not None and f.retry_delay is not None
            window = windows.get(row.pool)
            if window is None:
                window = windows[row.pool] = self._window(conn, row.pool, f.budget, row.now)
            if f.budget.allows(window.retries, window.deliveries):
                window.retries += 1
                window.new_retries += 1
            else:
                window.deferred += 1
                deferrals[f.lease.job_id] = Deferral(
                    f.budget.window + f.retry_delay,
                    f"{f.message} ({DEFERRED}: {window.retries} retries for "
                    f"{window.deliveries} deliveries in the last {f.budget.window:g}s)",
                )
        for pool, w in windows.items():
            self._add(conn, pool, w.bucket, retries=w.new_retries, deferred=w.deferred)
        return deferrals

    def _window(self, conn: Connection, pool: str, budget: RetryBudget, now: float) -> _Window:
        bucket = bucket_of(now)
        since = bucket - window_buckets(budget.window)
        deliveries, retries = conn.execute(
            self._window_stmt, {"b_pool": pool, "b_since": since}
        ).one()
        return _Window(bucket, int(deliveries), int(retries))

    def _add(self, conn: Connection, pool: str, bucket: int, **counts: int) -> None:
        values = {"deliveries": 0, "retries": 0, "deferred": 0, **counts}
        if any(values.values()):
            conn.execute(self._add_stmt, {"b_pool": pool, "b_bucket": bucket, **values})

    # ---- statements ---------------------------------------------------------------------

    @cached_property
    def _add_stmt(self) -> Any:
        stmt = self._insert(retry_budget).values(
            pool=bindparam("b_pool"),
            bucket=bindparam("b_bucket"),
            deliveries=bindparam("deliveries"),
            retries=bindparam("retries"),
            deferred=bindparam("deferred"),
        )
        table = retry_budget.c
        return stmt.on_conflict_do_update(
            index_elements=[table.pool, table.bucket],
            set_={
                "deliveries": table.deliveries + stmt.excluded.deliveries,
                "retries": table.retries + stmt.excluded.retries,
                "deferred": table.deferred + stmt.excluded.deferred,
            },
        )

    @cached_property
    def _window_stmt(self) -> Any:
        table = retry_budget.c
        return select(
            func.coalesce(func.sum(table.deliveries), 0),
            func.coalesce(func.sum(table.retries), 0),
        ).where(table.pool == bindparam("b_pool"), table.bucket > bindparam("b_since"))

    @cached_property
    def _prune_stmt(self) -> Any:
        table = retry_budget.c
        return delete(retry_budget).where(
            and_(table.pool == bindparam("b_pool"), table.bucket <= bindparam("b_before"))
        )

    @cached_property
    def _targets_stmt(self) -> Any:
        """The failing jobs still leased under their tokens (locked for this transaction on
        PostgreSQL), with their pool, whether this was their last delivery, and now. Not
        those whose cancel was requested: their failure ends them cancelled, not retried, so
        it spends nothing of the budget."""
        return (
            select(
                jobs.c.id,
                jobs.c.lease_token,
                jobs.c.pool,
                (jobs.c.attempts >= jobs.c.max_deliveries).label("at_limit"),
                self._now.label("now"),
            )
            .where(
                jobs.c.state == JobState.LEASED.value,
                jobs.c.cancel_requested_at.is_(None),
                tuple_(jobs.c.id, jobs.c.lease_token).in_(bindparam("leases", expanding=True)),
            )
            .with_for_update()
        )


@dataclass(slots=True)
class _Window:
    """One pool's budget during one ``fail`` call: the window's sums, and what this call adds."""

    bucket: int
    deliveries: int
    retries: int
    new_retries: int = 0
    deferred: int = 0
