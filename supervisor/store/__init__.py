"""The durable queue. ``open_store(url)`` returns a ``Store``: SQLite for one host (the
default), PostgreSQL for several. Only this package imports SQLAlchemy; everything else speaks
the verbs of ``Store``, named for the lease state machine in ``supervisor.model``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from supervisor.clock import Clock
from supervisor.errors import StoreError, StoreUnavailable
from supervisor.model import (
    Ack,
    AdvanceOutcome,
    CancelOutcome,
    Claimed,
    ClaimLimits,
    ControlState,
    FailOutcome,
    Failure,
    Job,
    JobFilter,
    JobState,
    Lease,
    NewJob,
    Pause,
    PoolHistory,
    PoolStats,
    ReapOutcome,
    RetryBudget,
    ScheduleAdvance,
    ScheduleRead,
)

if TYPE_CHECKING:
    from supervisor.rates import RateLimit
    from supervisor.store.claim import ClaimRequest
    from supervisor.store.rated import RatedRows
    from supervisor.store.rows import ClaimRow


class Store(Protocol):
    """The verbs every engine implements; one conformance suite (tests/store) runs on each."""

    dialect: str

    def migrate(self) -> int: ...
    def now(self) -> float: ...
    def close(self) -> None: ...
    def enqueue(self, job: NewJob) -> int: ...
    def enqueue_many(self, new: Sequence[NewJob]) -> list[int]: ...
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
    ) -> list[Claimed]: ...
    def claim_rows(self, claim: ClaimRequest) -> list[ClaimRow]: ...
    def claim_rated(self, claim: ClaimRequest, rate: RateLimit) -> RatedRows: ...
    def rate_levels(self, pool: str) -> dict[str, tuple[float, float]]: ...
    def extend(self, leases: Sequence[Lease], *, lease: float) -> list[Lease]: ...
    def ack(self, acks: Sequence[Ack]) -> list[Lease]: ...
    def fail(self, failures: Sequence[Failure]) -> FailOutcome: ...
    def release(self, leases: Sequence[Lease]) -> list[int]: ...
    def reap(self, *, limit: int = 1000) -> ReapOutcome: ...
    def get(self, job_id: int) -> Job | None: ...
    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        pool: str | None = None,
        limit: int = 100,
        after_id: int = 0,
    ) -> list[Job]: ...
    def stats(self, pools: Collection[str]) -> dict[str, PoolStats]: ...
    def history(self, pool: str, *, window: float, sample: int = 500) -> PoolHistory: ...
    def dlq_list(self, *, pool: str | None = None, limit: int = 100) -> list[Job]: ...
    def dlq_requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        pool: str | None = None,
        where: JobFilter | None = None,
    ) -> list[int]: ...
    def dlq_purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        pool: str | None = None,
        where: JobFilter | None = None,
    ) -> list[int]: ...
    def cancel(
        self, ids: Sequence[int] | None = None, *, where: JobFilter | None = None
    ) -> CancelOutcome: ...
    def find_jobs(
        self, where: JobFilter, states: Sequence[JobState], *, limit: int = 100
    ) -> tuple[int, list[Job]]: ...
    def find_cancellable(self, where: JobFilter, *, limit: int = 100) -> tuple[int, list[Job]]: ...
    def pause(self, pool: str, kind: str | None = None) -> bool: ...
    def resume(
        self, pool: str, kind: str | None = None, *, pool_wide_only: bool = False
    ) -> list[Pause]: ...
    def pauses(self) -> list[Pause]: ...
    def controls(self, node: str) -> ControlState: ...
    def prune(self, *, older_than: float, batch: int = 5000) -> int: ...
    def register_node(self, *, node_id: str, hostname: str, pid: int, fleet: str) -> None: ...
    def node_heartbeat(self, node_id: str, *, state: str, snapshot: str | None) -> None: ...
    def list_nodes(self) -> list[dict[str, Any]]: ...
    def arrivals(self, *, after_id: int | None) -> tuple[dict[str, int], int]: ...
    def waker(self) -> Any: ...
    def final_watch(self, within: float = ...) -> Any: ...
    def schedule_states(self, names: Collection[str] | None = None) -> ScheduleRead: ...
    def register_schedules(self, timings: Mapping[str, str]) -> None: ...
    def retime_schedule(self, name: str, expected: str, timing: str) -> bool: ...
    def advance_schedule(self, advance: ScheduleAdvance) -> AdvanceOutcome: ...
    def note_schedule_success(self, name: str, at: float) -> bool: ...


def display_url(url: str) -> str:
    """A database URL fit to print: the password hidden."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<not a database URL>"


def open_store(
    url: str,
    clock: Clock | None = None,
    *,
    migrate: bool = True,
    create: bool = True,
    bounded: bool = False,
) -> Store:
    """Open (and by default migrate) the store at a SQLAlchemy URL. A URL that cannot be
    parsed, reached or migrated raises ``StoreError`` with one line that says which and why.
    ``create=False`` (commands that only read or fix up what is there): a SQLite file that
    does not exist is that error, not a new empty queue at a mistyped path. ``bounded`` (the
    supervisor's store process): every PostgreSQL statement and lock wait has a time limit."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(
            f"database {url!r} is not a database URL (expected e.g. "
            "'sqlite:///fleetd.db' or 'postgresql://host/db')"
        ) from exc
    store = _engine_for(parsed, clock, create, bounded)
    if migrate:
        try:
            store.migrate()
        except StoreUnavailable as exc:
            store.close()
            shown = parsed.render_as_string(hide_password=True)
            raise StoreError(f"cannot open database {shown}: {exc}") from exc
    return store


def _engine_for(url: Any, clock: Clock | None, create: bool, bounded: bool) -> Store:
    backend = url.get_backend_name()
    if backend == "sqlite":
        from supervisor.store.sqlite import SqliteStore

        return SqliteStore(url, clock, create=create)
    if backend == "postgresql":
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise StoreError(
                "PostgreSQL needs the psycopg driver: pip install 'fleetd[postgres]'"
            ) from exc
        from supervisor.store.postgres import PostgresStore

        return PostgresStore(url.set(drivername="postgresql+psycopg"), clock, bounded=bounded)
    raise StoreError(
        f"database {url.render_as_string(hide_password=True)!r}: unsupported "
        "engine (expected sqlite:/// or postgresql://)"
    )
