"""``ClaimRequest``: what one claim asks of the store, as one value. The loop builds it
(supervisor/run/dispatch.py) and sends it to its store process; the store's claim verbs take it
(``SqlStore.claim_rows``, ``claim_rated``, the capped claim), and ``Store.claim`` builds one from
keywords for tests and tools. Imports nothing of SQLAlchemy: the loop and the store both use it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.model import ClaimLimits, RetryBudget


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Lease up to ``n`` ready jobs of ``pool`` whose kind is in ``kinds`` for ``node``, each
    for ``lease`` seconds. ``limits``: the pool's fleet-wide caps and fair order (None: plain
    FIFO by priority); ``budget``: its retry budget, which counts each delivery; ``finished``:
    per tenant, this node's jobs of the pool that ended but whose results are not written yet
    (the fair order does not count them as running; caps still do)."""

    pool: str
    kinds: Collection[str]
    n: int
    node: str
    lease: float
    limits: ClaimLimits | None = None
    budget: RetryBudget | None = None
    finished: Mapping[str, int] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as a call with its fields (it crosses the store link on every claim): a
        # slots dataclass's own way sets its state field by field in Python, several µs
        return (
            ClaimRequest,
            (
                self.pool,
                self.kinds,
                self.n,
                self.node,
                self.lease,
                self.limits,
                self.budget,
                self.finished,
            ),
        )
