"""What the loop asks of its store processes: one frozen value per request, and the verb it runs
(``run(store)``, in the store process or inline). ``link.submit(request, on_reply)`` sends one
(supervisor/run/link.py).

    claims      ClaimRows, ClaimRated, ArmedClaim (and the store process's own: Disarm,
                Fire, Retime, answered once it acted)
    leases      Extend, WriteResults (acks, failures, releases: storecalls.write_results)
    chores      Reap, Prune, NodeHeartbeat, SchedulePass
    reads       ReadControls, ScalerRead, GetJob; and the observer's figures,
                ``ObserverRead`` in supervisor/observe/observer.py (observe/ never imports run/)

They cross a socket pickled: each pickles as a call of its class with its fields
(``__reduce__``; a slots dataclass's own way sets its state field by field in Python), and what
a request carries per job stays a plain tuple (supervisor/run/storecalls.py). What a typed value
costs is its class, found by name on each side: a claim's round trip through pickle measured
6.7 µs against 1.7 µs for the (id, name, args, kwargs) tuple it replaced, a Fire 2.6 against
0.8 µs (a NamedTuple is no cheaper). That is per request, never per job: a loop sending a
thousand claims a second pays 5 ms of it. Only store verbs are called here: the SQL stays in
supervisor/store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from supervisor.model import ControlState, Job, Lease, ReapOutcome
from supervisor.run import storecalls
from supervisor.run.storecalls import Results, Written
from supervisor.store.claim import ClaimRequest

if TYPE_CHECKING:
    from supervisor.rates import RateLimit
    from supervisor.run.schedulepass import Passes, PassReport
    from supervisor.schedules import ScheduleSpec
    from supervisor.store import Store
    from supervisor.store.rated import RatedRows
    from supervisor.store.rows import ClaimRow

T_co = TypeVar("T_co", covariant=True)


class Request(Protocol[T_co]):
    """One call of the loop's: what it runs against the store, and so what its reply holds."""

    def run(self, store: Store) -> T_co: ...


# ---- claims ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimRows:
    """A claim, answered with its jobs as ``ClaimRow`` tuples."""

    claim: ClaimRequest

    def run(self, store: Store) -> list[ClaimRow]:
        return store.claim_rows(self.claim)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClaimRows, (self.claim,))


@dataclass(frozen=True, slots=True)
class ClaimRated:
    """A rate-limited pool's claim: its tokens spent, the next one's wait said."""

    claim: ClaimRequest
    rate: RateLimit

    def run(self, store: Store) -> RatedRows:
        return store.claim_rated(self.claim, self.rate)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClaimRated, (self.claim, self.rate))


@dataclass(frozen=True, slots=True)
class ArmedClaim:
    """A claim the store process holds until a wake-up names ``claim.pool``, or ``wait``
    seconds pass (its poll is due), or a ``Fire``/``Disarm`` comes: then it runs as
    ``ClaimRows`` would (supervisor/run/storeserve.py). Answered only then."""

    claim: ClaimRequest
    wait: float

    def run(self, store: Store) -> list[ClaimRow]:
        return store.claim_rows(self.claim)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ArmedClaim, (self.claim, self.wait))


@dataclass(frozen=True, slots=True)
class Disarm:
    """Run every armed claim now (a drain, an emergency stop); answered after them."""

    def run(self, store: Store) -> list[ClaimRow]:
        return []

    def __reduce__(self) -> tuple[Any, ...]:
        return (Disarm, ())


@dataclass(frozen=True, slots=True)
class Fire:
    """Run ``pool``'s armed claim now (the loop learned of new jobs first)."""

    pool: str

    def run(self, store: Store) -> list[ClaimRow]:
        return []

    def __reduce__(self) -> tuple[Any, ...]:
        return (Fire, (self.pool,))


@dataclass(frozen=True, slots=True)
class Retime:
    """Bring ``pool``'s armed claim's deadline forward to ``wait`` seconds from now (a retry
    comes due sooner: a retry sends no wake-up)."""

    pool: str
    wait: float

    def run(self, store: Store) -> list[ClaimRow]:
        return []

    def __reduce__(self) -> tuple[Any, ...]:
        return (Retime, (self.pool, self.wait))


# ---- leases and results ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Extend:
    """Extend ``leases`` by ``lease`` seconds; answered with those not extended (lost)."""

    leases: Sequence[Lease]
    lease: float

    def run(self, store: Store) -> list[Lease]:
        return store.extend(self.leases, lease=self.lease)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Extend, (self.leases, self.lease))


@dataclass(frozen=True, slots=True)
class WriteResults:
    """Acks, failures and releases in one request (``storecalls.write_results``)."""

    results: Results

    def run(self, store: Store) -> Written:
        return storecalls.write_results(store, self.results)

    def __reduce__(self) -> tuple[Any, ...]:
        return (WriteResults, (self.results,))


# ---- chores ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reap:
    """Expired leases back to the queue, and the rows of the first ``read_at_most``."""

    read_at_most: int

    def run(self, store: Store) -> tuple[ReapOutcome, list[Job]]:
        return storecalls.reap_described(store, self.read_at_most)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Reap, (self.read_at_most,))


@dataclass(frozen=True, slots=True)
class Prune:
    """Delete done jobs that finished more than ``older_than`` seconds ago."""

    older_than: float

    def run(self, store: Store) -> int:
        return store.prune(older_than=self.older_than)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Prune, (self.older_than,))


@dataclass(frozen=True, slots=True)
class NodeHeartbeat:
    """This node's row: its state and snapshot (JSON)."""

    node_id: str
    state: str
    snapshot: str | None

    def run(self, store: Store) -> None:
        store.node_heartbeat(self.node_id, state=self.state, snapshot=self.snapshot)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NodeHeartbeat, (self.node_id, self.state, self.snapshot))


@dataclass(frozen=True, slots=True)
class SchedulePass:
    """One pass over the schedules (supervisor/run/schedulepass.py: read, plan, advance)."""

    specs: Sequence[ScheduleSpec]
    passes: Passes | None = None

    def run(self, store: Store) -> PassReport:
        from supervisor.run import schedulepass

        return schedulepass.schedule_pass(store, self.specs, self.passes)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SchedulePass, (self.specs, self.passes))


# ---- reads -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadControls:
    """The pauses in force and the cancels asked of ``node``'s jobs."""

    node: str

    def run(self, store: Store) -> ControlState:
        return store.controls(self.node)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReadControls, (self.node,))


@dataclass(frozen=True, slots=True)
class ScalerRead:
    """What the scaler decides from: stats, each pool's history, the live nodes."""

    pools: Sequence[str]
    window: float

    def run(self, store: Store) -> tuple[Any, Any, Any]:
        stats = store.stats(self.pools)
        history = {name: store.history(name, window=self.window) for name in self.pools}
        return stats, history, store.list_nodes()

    def __reduce__(self) -> tuple[Any, ...]:
        return (ScalerRead, (self.pools, self.window))


@dataclass(frozen=True, slots=True)
class GetJob:
    """One job's row (None: no such job)."""

    job_id: int

    def run(self, store: Store) -> Job | None:
        return store.get(self.job_id)

    def __reduce__(self) -> tuple[Any, ...]:
        return (GetJob, (self.job_id,))
