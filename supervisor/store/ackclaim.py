"""``SqlStore.ack_and_claim``: a batch of acks and a pool's next claim, one transaction.

The supervisor's loop sends its waiting results with a claim whenever it claims
(supervisor/run/storecalls.py ``write_and_claim``). On SQLite the acks and the claim then
share one ``BEGIN IMMEDIATE`` transaction: one commit, and one trip through SQLAlchemy's
transaction and pool, where there were two (docs/benchmarks.md: the jobs of one Redis INCR).

Nothing of either verb's guarantee changes. The acks are ``SqlStore.ack``'s executemany,
guarded by state and lease token row by row; if fewer rows changed than acks were given, the
transaction is rolled back, the claim with it, and the acks are redone by ``ack``'s own slow
path (a read of the leases still ours, then those rows). The claim is ``claim_rows``'s plain
claim (``SqlStore._claim_plain_in``): for a fair pool, guarded to take nothing while more than
one tenant is queued; it counts its deliveries in the pool's retry budget in the same
transaction. One transaction: an error leaves both undone. What it does not claim (the acks
redone; a pool whose tenants are mixed, which claims in the fair order; caps, never sent
here) it says so, and the caller claims after, in a transaction of the claim's own.

PostgreSQL does not use it (``PostgresStore.acks_share_claims``): there each verb is one
autocommit statement already, and a transaction around both adds its BEGIN and COMMIT round
trips. It runs there all the same, and the conformance suite holds it to the same contract.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from supervisor.model import Ack, ClaimLimits, Lease, RetryBudget
from supervisor.store.rows import ClaimRow


class Partial(Exception):
    """Inside the store only: a batched write did not take for every row; roll it back."""


class AckClaims:
    """Acks and a plain claim in one transaction, for ``SqlStore``."""

    # whether the supervisor sends its acks with its claims as one verb (SQLite); PostgreSQL
    # writes and claims with one autocommit statement each instead
    acks_share_claims = True

    if TYPE_CHECKING:  # provided by SqlStore
        _mixed_pools: set[str]

        def _tx(self) -> AbstractContextManager[Connection]: ...
        def _ack_params(self, acks: Sequence[Ack]) -> list[dict[str, Any]]: ...
        def _ack_every(self, conn: Connection, params: list[dict[str, Any]]) -> None: ...
        def _ack_owned(self, acks: Sequence[Ack], params: list[dict[str, Any]]) -> list[Lease]: ...
        def _finals_committed(self, ids: Sequence[int]) -> None: ...
        def _claim_plain_in(
            self,
            conn: Connection,
            pool: str,
            kinds: Collection[str],
            n: int,
            node: str,
            lease: float,
            by_tenant: bool,
            budget: RetryBudget | None,
        ) -> list[ClaimRow] | None: ...
        def ack(self, acks: Sequence[Ack]) -> list[Lease]: ...

    def ack_and_claim(
        self,
        acks: Sequence[Ack],
        *,
        pool: str,
        kinds: Collection[str],
        n: int,
        node: str,
        lease: float,
        limits: ClaimLimits | None = None,
        budget: RetryBudget | None = None,
    ) -> tuple[list[Lease], list[ClaimRow] | None]:
        """``ack(acks)`` and, in the same transaction, the pool's claim when it is the plain
        one (as ``claim_rows`` makes it: ``limits`` may ask for the fair order, never caps):
        the leases that were no longer ours, as ``ack`` returns them, and the jobs claimed.
        The claim comes back None when it was not made: an ack did not take (the acks were
        then redone as ``ack`` does), or the pool holds more than one tenant's jobs and
        claims in the fair order; the caller claims after (``claim_rows``)."""
        if limits is not None and limits.capped:
            raise ValueError("ack_and_claim: a capped claim has a transaction of its own")
        by_tenant = limits is not None and limits.fair
        if not acks or n <= 0 or not kinds or (by_tenant and pool in self._mixed_pools):
            return self.ack(acks), None
        params = self._ack_params(acks)
        try:
            with self._tx() as conn:
                self._ack_every(conn, params)
                rows = self._claim_plain_in(conn, pool, kinds, n, node, lease, by_tenant, budget)
        except Partial:  # rolled back, the claim with it: the acks as ack redoes them
            return self._ack_owned(acks, params), None
        self._finals_committed([p["b_id"] for p in params])
        return [], rows
