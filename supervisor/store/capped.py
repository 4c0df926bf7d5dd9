"""The capped claim's transaction: ``SqlStore.claim`` with capped ``ClaimLimits`` comes here,
and so does a fair pool's claim while more than one tenant is queued (no caps to keep: the
room is the claim's ``n``).

What to take, and in which order, is decided in supervisor/store/fair.py (its statements and the
pure fair pick, with the reasoning). This module runs those steps against the database: count,
read the window, pick, lease, in one transaction serialised per pool, and keeps the per-pool
state one claim hands to the next (the round-robin cursor and the window's width).

``CappedClaims`` is a mixin of ``SqlStore``, not a store of its own: it runs in the store's
transactions, reads the store's clock and leases with the store's lease values, exactly as the
plain claim does (what it takes from ``SqlStore`` is declared at the top of the class).
``PostgresStore`` overrides ``_lock_claims``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, and_, bindparam, update
from sqlalchemy.sql.elements import ColumnElement

from supervisor.model import ClaimLimits, JobState
from supervisor.store import fair
from supervisor.store.budget import Budgets
from supervisor.store.claim import ClaimRequest
from supervisor.store.rated import with_kind_tokens
from supervisor.store.rows import CLAIMED_COLUMNS, ClaimRow, claim_row
from supervisor.store.schema import jobs

QUEUED = JobState.QUEUED.value


class CappedClaims:
    """The capped claim, for ``SqlStore``."""

    if TYPE_CHECKING:  # provided by SqlStore
        engine: Engine
        _budgets: Budgets

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _exec(
            self, conn: Connection, stmt: Any, params: dict[str, Any] | None = None
        ) -> Any: ...
        def _now(self) -> ColumnElement[float]: ...
        def _mostly_true(self, condition: ColumnElement[bool]) -> ColumnElement[bool]: ...
        def _lease_values(self) -> dict[str, Any]: ...

    def _claim_capped(self, claim: ClaimRequest, limits: ClaimLimits) -> list[ClaimRow]:
        """Count, choose and lease in one transaction, serialised per pool (fair.py).
        ``limits``: the claim's (capped, or a fair pool's with more than one tenant queued)."""
        with self._tx() as conn:
            self._lock_claims(conn, claim.pool)
            return self._capped_in(conn, claim, limits)

    def _capped_in(
        self,
        conn: Connection,
        claim: ClaimRequest,
        limits: ClaimLimits,
        kind_tokens: dict[str, int] | None = None,
    ) -> list[ClaimRow]:
        """The capped claim inside a transaction that holds the pool's claim lock.
        ``kind_tokens``: rate-limited kinds' tokens (supervisor/store/rated.py), each kind
        then capped at its leased jobs plus its tokens. ``claim.finished``: this node's ended
        jobs not yet written, left out of the fair order (fair.Running.finished)."""
        pool, n = claim.pool, claim.n
        leased = conn.execute(self._leased_stmt, {"c_pool": pool})
        running = fair.Running.of(leased, claim.finished)
        if kind_tokens:
            limits = with_kind_tokens(limits, running.kinds, kind_tokens)
        room = running.room(limits, n)
        open_kinds = running.open_kinds(limits, claim.kinds)
        if room <= 0 or not open_kinds:
            return []
        # heads first when the last window had tenants enough to fill the room with them
        heads = self._widths.get(pool, room) >= room
        window = self._window(conn, pool, running, limits, open_kinds, room, heads=heads)
        taken = fair.pick(window, running, limits, room)
        if heads and not fair.heads_decide(window, running, limits, open_kinds, room, taken):
            window = self._window(conn, pool, running, limits, open_kinds, room)
            taken = fair.pick(window, running, limits, room)
        self._cursors[pool] = window.next_cursor(taken)
        self._widths[pool] = len(window.tenants)
        if not taken:
            return []
        chosen = [c.id for c in taken]
        params = {"c_ids": chosen, "c_node": claim.node, "c_lease": claim.lease}
        rows = {r.id: r for r in self._exec(conn, self._take_stmt, params)}
        if claim.budget is not None and rows:
            at = next(iter(rows.values())).started_at
            self._budgets.count_deliveries(conn, pool, claim.budget, len(rows), at)
        return [claim_row(rows[i]) for i in chosen if i in rows]

    def _window(
        self,
        conn: Connection,
        pool: str,
        running: fair.Running,
        limits: ClaimLimits,
        kinds: list[str],
        room: int,
        heads: bool = False,
    ) -> fair.Window:
        """The capped claim's candidates: one read of the tenant window per kind group (with
        ``heads``, each tenant's first row only)."""
        full = running.full_tenants(limits)
        k = 1 if heads else fair.per_tenant(limits, room)
        groups = fair.kind_groups(running, limits, kinds, k)

        def read(window: dict[str, Any]) -> list[Any]:
            return [
                row
                for group, k in groups
                for row in self._exec(
                    conn,
                    self._candidates_stmt,
                    {"c_pool": pool, "c_full": full, "c_kinds": group, "c_k": k, **window},
                )
            ]

        # tenants at their cap are probed but never read: they widen the window
        return fair.gather(read, self._cursors.get(pool), fair.WINDOW + len(full))

    def _lock_claims(self, conn: Connection, pool: str) -> None:
        """Serialise capped claims of ``pool`` until this transaction ends. SQLite: BEGIN
        IMMEDIATE already did; PostgreSQL takes an advisory lock."""

    @cached_property
    def _cursors(self) -> dict[str, str | None]:
        """Per pool: the tenant where the last capped claim's window ended (fair.gather)."""
        return {}

    @cached_property
    def _widths(self) -> dict[str, int]:
        """Per pool: how many tenants the last capped claim's window held."""
        return {}

    @cached_property
    def _leased_stmt(self) -> Any:
        return fair.leased_stmt()

    @cached_property
    def _candidates_stmt(self) -> Any:
        lateral = self.engine.dialect.name == "postgresql"
        return fair.candidates_stmt(self._now(), lateral=lateral, mostly_true=self._mostly_true)

    @cached_property
    def _take_stmt(self) -> Any:
        """Lease exactly the jobs the capped claim chose (still queued: nothing else takes
        queued jobs of a pool whose claims are serialised)."""
        chosen = and_(jobs.c.id.in_(bindparam("c_ids", expanding=True)), jobs.c.state == QUEUED)
        return update(jobs).where(chosen).values(self._lease_values()).returning(*CLAIMED_COLUMNS)
