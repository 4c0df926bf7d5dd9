"""``SqlStore.ack_and_claim``: a batch of acks and a pool's next plain claim, one transaction.

The supervisor's loop sends its waiting results with a claim whenever it claims
(supervisor/run/storecalls.py ``write_and_claim``). On SQLite the acks and the claim then
share one ``BEGIN IMMEDIATE`` transaction: one commit, and one trip through SQLAlchemy's
transaction and pool, where there were two (docs/benchmarks.md: the jobs of one Redis INCR).

Nothing of either verb's guarantee changes. The acks are ``SqlStore.ack``'s executemany,
guarded by state and lease token row by row; if fewer rows changed than acks were given, the
transaction is rolled back, the claim with it, and the acks are redone by ``ack``'s own slow
path (a read of the leases still ours, then those rows), the claim after them on its own. The
claim is the plain claim's own statement (``SqlStore._plain_claim``), and counts its
deliveries in the pool's retry budget in the same transaction. One transaction: an error
leaves both undone. Pools with fleet-wide caps or a fair order claim on their own.

PostgreSQL does not use it (``PostgresStore.acks_share_claims``): there each verb is one
autocommit statement already, and a transaction around both adds its BEGIN and COMMIT round
trips. It runs there all the same, and the conformance suite holds it to the same contract.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from supervisor.model import Ack, Lease, RetryBudget
from supervisor.store import driver
from supervisor.store.budget import Budgets
from supervisor.store.rows import CLAIMED_AT, ClaimRow, claim_order, claim_row


class Partial(Exception):
    """Inside the store only: a batched write did not take for every row; roll it back."""


class AckClaims:
    """Acks and a plain claim in one transaction, for ``SqlStore``."""

    # whether the supervisor sends its acks with its claims as one verb (SQLite); PostgreSQL
    # writes and claims with one autocommit statement each instead
    acks_share_claims = True

    if TYPE_CHECKING:  # provided by SqlStore
        _budgets: Budgets

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _ack_params(self, acks: Sequence[Ack]) -> list[dict[str, Any]]: ...
        def _ack_every(self, conn: Connection, params: list[dict[str, Any]]) -> None: ...
        def _ack_owned(self, acks: Sequence[Ack], params: list[dict[str, Any]]) -> list[Lease]: ...
        def _finals_committed(self, ids: Sequence[int]) -> None: ...
        def _plain_claim(
            self, pool: str, kinds: Collection[str], n: int, node: str, lease: float
        ) -> tuple[driver.Raw, dict[str, Any]]: ...
        def ack(self, acks: Sequence[Ack]) -> list[Lease]: ...
        def claim_rows(self, **claim: Any) -> list[ClaimRow]: ...

    def ack_and_claim(
        self,
        acks: Sequence[Ack],
        *,
        pool: str,
        kinds: Collection[str],
        n: int,
        node: str,
        lease: float,
        budget: RetryBudget | None = None,
    ) -> tuple[list[Lease], list[ClaimRow]]:
        """``ack(acks)``, then the plain ``claim_rows`` of ``pool`` (no caps, no fair order):
        the leases that were no longer ours, as ``ack`` returns them, and the jobs claimed, as
        ``claim_rows`` returns them. One transaction; when an ack did not take, the acks go
        ``ack``'s slow way and the claim runs after them."""
        claim = {"pool": pool, "kinds": kinds, "n": n, "node": node, "lease": lease}
        if not acks:
            return [], self.claim_rows(**claim, budget=budget)
        if n <= 0 or not kinds:  # nothing to claim (as claim_rows)
            return self.ack(acks), []
        params = self._ack_params(acks)
        raw, claim_params = self._plain_claim(pool, kinds, n, node, lease)
        try:
            with self._tx() as conn:
                self._ack_every(conn, params)
                rows = driver.fetchall(conn, raw, claim_params)
                if budget is not None and rows:
                    at = rows[0][CLAIMED_AT]
                    self._budgets.count_deliveries(conn, pool, budget, len(rows), at)
        except Partial:  # rolled back, the claim with it: the acks the slow way, then it
            return self._ack_owned(acks, params), self.claim_rows(**claim, budget=budget)
        self._finals_committed([p["b_id"] for p in params])
        rows.sort(key=claim_order)
        return [], [claim_row(r) for r in rows]
