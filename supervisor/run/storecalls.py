"""What the store process runs for the requests made of several verbs (supervisor/run/
requests.py), so that one request does one step of the loop's work: the results' write, narrowed
to a row, and the reaper's pass with the rows it logs.

They run in the store process (or inline, in tests); arguments and results cross a socket
pickled. What crosses once per job is a plain tuple (``ClaimRow``, ``AckRow``): pickling a
dataclass instance costs ~3 µs each way, a tuple ~0.1 µs, and at thousands of jobs a second
that was a tenth of a job's CPU. What crosses once per request (``Results``, ``Written``)
pickles as a call of its class with its fields (``__reduce__``): a slots dataclass's default
sets its state field by field in Python, ~8 µs each way for ``Written``. Only store verbs are
called here: the SQL stays in supervisor/store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from supervisor.errors import StoreError, StoreUnavailable
from supervisor.model import Ack, Claimed, FailOutcome, Failure, Job, Lease, ReapOutcome
from supervisor.store.rows import ClaimRow

if TYPE_CHECKING:
    from supervisor.store import Store

T = TypeVar("T")
R = TypeVar("R")

# a result on the wire: (pool, job id, lease token, result JSON, peak RSS, duration)
AckRow = tuple[str, int, str, str, int | None, float | None]


def claimed_job(row: ClaimRow) -> Claimed:
    return Claimed(Lease(row[0], row[1]), *row[2:])


def ack_of(row: AckRow) -> Ack:
    return Ack(Lease(row[1], row[2]), row[3], row[4], row[5])


# ---- results: acks, failures and releases in one request -------------------------------------


@dataclass(slots=True)
class Results:
    """Results to write: (pool, ack), (pool, failure), and leases to release."""

    acks: list[AckRow] = field(default_factory=list)
    fails: list[tuple[str, Failure]] = field(default_factory=list)
    releases: list[Lease] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.acks) + len(self.fails) + len(self.releases)

    def __reduce__(self) -> tuple[Any, ...]:  # as a call with its fields (see the docstring)
        return (Results, (self.acks, self.fails, self.releases))

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
    refused_acks: list[tuple[AckRow, str]] = field(default_factory=list)
    refused_fails: list[tuple[str, Failure, str]] = field(default_factory=list)
    refused_releases: list[tuple[Lease, str]] = field(default_factory=list)
    unwritten: Results = field(default_factory=Results)
    error: StoreUnavailable | None = None

    def __reduce__(self) -> tuple[Any, ...]:  # as a call with its fields (see the docstring)
        return (
            Written,
            (
                self.lost_acks,
                self.failed,
                self.released,
                self.refused_acks,
                self.refused_fails,
                self.refused_releases,
                self.unwritten,
                self.error,
            ),
        )


def write_results(store: Store, todo: Results) -> Written:
    out = Written()
    left = Results(list(todo.acks), list(todo.fails), list(todo.releases))
    bug: Exception | None = None
    for section, items in ((_acks, left.acks), (_fails, left.fails), (_releases, left.releases)):
        try:
            section(store, items, out)  # type: ignore[operator]
        except StoreUnavailable as exc:
            out.error, out.unwritten = exc, left
            return out
        except Exception as exc:
            # a bug in one verb (the reply says so: the loop's guard) does not keep the
            # others from being written: an emergency stop's releases go through a bug in ack
            bug = bug or exc
    if bug is not None:
        raise bug
    return out


def _acks(store: Store, acks: list[AckRow], out: Written) -> None:
    _narrowed(
        acks,
        lambda rows: store.ack([ack_of(r) for r in rows]),
        lambda rows, lost: out.lost_acks.extend(lost),
        lambda row, why: out.refused_acks.append((row, why)),
    )


def _fails(store: Store, fails: list[tuple[str, Failure]], out: Written) -> None:
    _narrowed(
        fails,
        lambda some: store.fail([f for _, f in some]),
        lambda some, outcome: out.failed.append((list(some), outcome)),
        lambda one, why: out.refused_fails.append((one[0], one[1], why)),
    )


def _releases(store: Store, releases: list[Lease], out: Written) -> None:
    _narrowed(
        releases,
        store.release,
        lambda leases, ids: out.released.extend(ids),
        lambda lease, why: out.refused_releases.append((lease, why)),
    )


def _narrowed(
    items: list[T],
    write: Callable[[list[T]], R],
    written: Callable[[list[T], R], object],
    refused: Callable[[T, str], object],
) -> None:
    """Write ``items`` in one call; if the database refuses it (any StoreError but
    StoreUnavailable, which goes up: the caller keeps what is left for later), write them
    again one at a time, so the refused ones are found and every other one is written. Each
    item is removed from ``items`` once it is dealt with."""
    if not items:
        return
    try:
        written(items, write(items))
        items.clear()
        return
    except StoreUnavailable:
        raise
    except StoreError:  # refused (or a driver error): narrowed to its row below
        pass
    while items:
        one = items[:1]
        try:
            written(one, write(one))
        except StoreUnavailable:
            raise
        except StoreError as exc:
            refused(one[0], str(exc))
        items.pop(0)


# ---- reads and housekeeping ------------------------------------------------------------------


def reap_described(store: Store, read_at_most: int) -> tuple[ReapOutcome, list[Job]]:
    """Expired leases back to the queue, and the rows of the first ``read_at_most`` of them
    (for one log line per job)."""
    out = store.reap()
    ids = [*out.dead, *out.cancelled, *out.requeued][:read_at_most]
    rows = [store.get(i) for i in ids]
    return out, [r for r in rows if r is not None]
