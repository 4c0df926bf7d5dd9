"""The calls the loop sends to its store process (supervisor/run/storelink.py): plain store
verbs, and a few made of several verbs so that one request does one step of the loop's work.

They run in the store process (or inline, in tests); arguments and results cross a socket
pickled, so they are plain values. Only store verbs are called here: the SQL stays in
supervisor/store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from supervisor.errors import StoreError, StoreUnavailable
from supervisor.model import Ack, FailOutcome, Failure, Job, Lease, ReapOutcome

# verbs a link may call by name, as they are
VERBS = frozenset({"claim", "extend", "prune", "node_heartbeat", "get"})


def run(store: Any, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if call in VERBS:
        return getattr(store, call)(*args, **kwargs)
    return PROCEDURES[call](store, *args, **kwargs)


# ---- results: acks, failures and releases in one request -------------------------------------


@dataclass(slots=True)
class Results:
    """Results to write: (pool, ack), (pool, failure), and leases to release."""

    acks: list[tuple[str, Ack]] = field(default_factory=list)
    fails: list[tuple[str, Failure]] = field(default_factory=list)
    releases: list[Lease] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.acks) + len(self.fails) + len(self.releases)

    def extend_front(self, other: Results) -> None:
        """Put ``other`` (older, unwritten) before what is here."""
        self.acks[:0] = other.acks
        self.fails[:0] = other.fails
        self.releases[:0] = other.releases


@dataclass(slots=True)
class Written:
    """What ``write_results`` did. A write the database refused (StoreRejected, or any other
    StoreError but StoreUnavailable) is narrowed to its row: the batch is written again one
    row at a time, the refused rows are returned with the reason,
    every other row is written. ``unwritten`` is what was left when the store became
    unavailable (``error``): the caller writes it again later."""

    lost_acks: list[Lease] = field(default_factory=list)
    failed: list[tuple[list[tuple[str, Failure]], FailOutcome]] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    refused_acks: list[tuple[str, Ack, str]] = field(default_factory=list)
    refused_fails: list[tuple[str, Failure, str]] = field(default_factory=list)
    refused_releases: list[tuple[Lease, str]] = field(default_factory=list)
    unwritten: Results = field(default_factory=Results)
    error: StoreUnavailable | None = None


def write_results(store: Any, todo: Results) -> Written:
    out = Written()
    left = Results(list(todo.acks), list(todo.fails), list(todo.releases))
    try:
        _acks(store, left.acks, out)
        _fails(store, left.fails, out)
        _releases(store, left.releases, out)
    except StoreUnavailable as exc:
        out.error, out.unwritten = exc, left
    return out


def _acks(store: Any, acks: list[tuple[str, Ack]], out: Written) -> None:
    if not acks:
        return
    try:
        out.lost_acks += store.ack([a for _, a in acks])
        acks.clear()
        return
    except StoreUnavailable:
        raise
    except StoreError:  # refused (or a driver error): narrowed to its row below
        pass
    while acks:
        pool, ack = acks[0]
        try:
            out.lost_acks += store.ack([ack])
        except StoreUnavailable:
            raise
        except StoreError as exc:
            out.refused_acks.append((pool, ack, str(exc)))
        acks.pop(0)


def _fails(store: Any, fails: list[tuple[str, Failure]], out: Written) -> None:
    if not fails:
        return
    try:
        out.failed.append((list(fails), store.fail([f for _, f in fails])))
        fails.clear()
        return
    except StoreUnavailable:
        raise
    except StoreError:  # refused (or a driver error): narrowed to its row below
        pass
    while fails:
        one = fails[0]
        try:
            out.failed.append(([one], store.fail([one[1]])))
        except StoreUnavailable:
            raise
        except StoreError as exc:
            out.refused_fails.append((one[0], one[1], str(exc)))
        fails.pop(0)


def _releases(store: Any, releases: list[Lease], out: Written) -> None:
    if not releases:
        return
    try:
        out.released += store.release(releases)
        releases.clear()
        return
    except StoreUnavailable:
        raise
    except StoreError:  # refused (or a driver error): narrowed to its row below
        pass
    while releases:
        try:
            out.released += store.release(releases[:1])
        except StoreUnavailable:
            raise
        except StoreError as exc:  # a lease holds nothing of the job's: not expected
            out.refused_releases.append((releases[0], str(exc)))
        releases.pop(0)


# ---- reads and housekeeping ------------------------------------------------------------------


def reap_described(store: Any, read_at_most: int) -> tuple[ReapOutcome, list[Job]]:
    """Expired leases back to the queue, and the rows of the first ``read_at_most`` of them
    (for one log line per job)."""
    out = store.reap()
    ids = [*out.dead, *out.requeued][:read_at_most]
    rows = [store.get(i) for i in ids]
    return out, [r for r in rows if r is not None]


def observer_read(store: Any, pools: list[str], after_id: int | None) -> tuple[Any, Any]:
    """The status figures: per-pool stats and enqueues since ``after_id``."""
    return store.stats(pools), store.arrivals(after_id=after_id)


def scaler_read(store: Any, pools: list[str], window: float) -> tuple[Any, Any, Any]:
    """What the scaler decides from: stats, each pool's history, the live nodes."""
    stats = store.stats(pools)
    history = {name: store.history(name, window=window) for name in pools}
    return stats, history, store.list_nodes()


PROCEDURES = {
    "write_results": write_results,
    "reap_described": reap_described,
    "observer_read": observer_read,
    "scaler_read": scaler_read,
}
