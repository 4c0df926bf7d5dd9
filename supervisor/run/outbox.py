"""``Outbox``: results on their way to the store, and ``StoreHealth``, the loop's view of it.

    worker ──JobDone/JobFailed/exit──> Outbox (acks, fails, releases) ──one batch at a time──>
    store process: write_results ──> Written: what took, what was refused (that job alone
    fails), what is left if the store became unavailable (written again after a backoff)

One batch is in flight at a time; results arriving meanwhile wait for the next. Failures and
releases go on the pass that saw them; acks alone wait up to ``ACK_WAIT`` for company while
other jobs run (a SQLite commit costs ~150 µs whatever it holds). Nothing is dropped while the
store is unreachable: it all stays here and counts as pending (a drain waits for it, up to its
write patience). Owned by the supervisor's main thread.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.model import Ack, Claimed, ErrorKind, FailOutcome, Failure, Lease
from supervisor.observe.logs import LOGGED_MESSAGE, job_event
from supervisor.run.counters import Counters
from supervisor.run.link import Link, Reply, StoreBug
from supervisor.run.requests import WriteResults
from supervisor.run.storecalls import AckRow, Results, Written, ack_of
from supervisor.storable import storable_message

log = logging.getLogger("fleetd.dispatch")

# seconds a result may wait for others to share its write, while other jobs run
ACK_WAIT = 0.005
ACK_BATCH = 100  # results that are written at once, without waiting
REFUSED = "fleetd: "  # starts a failure message fleetd wrote in place of a refused one


@dataclass
class StoreHealth:
    """Consecutive failed calls and the backoff they impose (100 ms doubling to 5 s). A
    StoreBug is no outage: the link raises it into the loop's guard once its caller has put
    back what it had in flight (supervisor/run/link.py), so it is neither counted nor waited
    for here."""

    counters: Counters
    failures: int = 0
    retry_at: float = 0.0  # no call before this (monotonic)

    def failed(self, now: float, what: str, exc: Exception) -> None:
        if isinstance(exc, StoreBug):
            return
        self.counters.store_errors += 1
        self.failures += 1
        backoff = min(5.0, 0.1 * 2 ** min(self.failures - 1, 10))
        self.retry_at = now + backoff
        if self.failures == 1 or self.failures % 20 == 0:
            log.error(
                "store unavailable (%s): %s; retrying in %.1fs (%d failures in a row)",
                what,
                exc,
                backoff,
                self.failures,
            )

    def ok(self) -> None:
        if self.failures:
            log.warning("store reachable again after %d failed calls", self.failures)
        self.failures = 0
        self.retry_at = 0.0


class Outbox:
    def __init__(
        self,
        link: Link,
        capped: set[str],
        counters: Counters,
        health: StoreHealth,
        monotonic: Callable[[], float],
    ) -> None:
        self.link = link
        self.monotonic = monotonic
        self.capped = capped  # pools under a fleet-wide cap: a result frees room
        self.counters = counters
        self.health = health
        self.todo = Results()
        self.writing: Results | None = None  # the batch in flight
        self.acks_due = 0.0  # when the oldest unwritten ack must be written (monotonic)
        self.failed: dict[int, Claimed] = {}  # job id -> the claim, until its failure is written
        self.retries_due: dict[str, list[float]] = {}  # pool -> heap of monotonic instants
        self.on_freed = lambda pool: None  # set by the dispatcher: wake a capped pool
        # per (pool, tenant): acks and failures in ``todo``, not sent yet. A claim sent now runs
        # before them on the link, and the fair order leaves them out (fair.Running.finished)
        self.finishing: Counter[tuple[str, str]] = Counter()
        self.on_retry_due = lambda pool, at: None  # set by the dispatcher: poll then

    # ---- adding ------------------------------------------------------------------------

    def ack(self, pool: str, ack: AckRow, now: float, tenant: str | None = None) -> None:
        """A result to write: (pool, job id, lease token, result JSON, peak RSS, duration)."""
        if not self.todo.acks:
            self.acks_due = now + ACK_WAIT
        self.todo.acks.append(ack)
        self.finishing[(pool, tenant or "")] += 1

    def finished(self, pool: str) -> dict[str, int]:
        """Per tenant, the pool's results not sent yet (a claim's ``finished``)."""
        return {t: n for (p, t), n in self.finishing.items() if p == pool}

    def fail(self, pool: str, failure: Failure, claimed: Claimed) -> None:
        self.todo.fails.append((pool, failure))
        self.finishing[(pool, claimed.tenant or "")] += 1
        self.failed[failure.lease.job_id] = claimed  # for the dead-letter line, if it dies

    def release(self, lease: Lease) -> None:
        self.todo.releases.append(lease)

    @property
    def pending(self) -> int:
        return len(self.todo) + (len(self.writing) if self.writing is not None else 0)

    # ---- writing -----------------------------------------------------------------------

    def flush(self, now: float, *, force: bool, running: bool) -> None:
        """Send what waits, unless a batch is in flight, the store is backing off, or only
        acks wait and may still get company (``running``: other jobs could join them)."""
        todo = self.todo
        if self.writing is not None or now < self.health.retry_at or not todo:
            return
        if not (
            force
            or todo.fails
            or todo.releases
            or len(todo.acks) >= ACK_BATCH
            or now >= self.acks_due
            or _pools(todo) & self.capped
            or not running
        ):
            return
        self.writing, self.todo = todo, Results()
        # sent: a claim sent after this runs after it. A batch that fails comes back to todo
        # uncounted; until it is written, the fair order counts those jobs as running
        self.finishing.clear()
        self.link.submit(WriteResults(todo), on_reply=self._written)

    def _written(self, reply: Reply) -> None:
        batch, self.writing = self.writing, None
        assert batch is not None
        now = self.monotonic()
        if reply.error is not None:  # the call itself failed
            self.todo.extend_front(batch)  # kept for the retry, or the emergency stop
            self.health.failed(now, "write results", reply.error)
            return
        out: Written = reply.value
        self.counters.lost_leases += len(out.lost_acks)
        for fails, outcome in out.failed:
            self._record_fails(outcome, fails)
        self.counters.releases += len(out.released)
        for row, why in out.refused_acks:
            ack = ack_of(row)
            self._refused(row[0], ack.lease, ErrorKind.PERMANENT, _ack_refused(why), ack)
        for pool, failure, why in out.refused_fails:
            if failure.message.startswith(REFUSED):
                # even fleetd's own message was refused: the lease expires into a reaper
                # (the job runs again; nothing is lost)
                log.error("job %s: failure not stored: %s", failure.lease.job_id, _said(why))
                self.failed.pop(failure.lease.job_id, None)
            else:
                text = f"{failure.error_kind}; its message could not be stored ({why})"
                self._refused(pool, failure.lease, failure.error_kind, text, failure)
        for lease, why in out.refused_releases:
            log.error("job %s: release refused: %s", lease.job_id, _said(why))
        if out.error is not None:
            self.todo.extend_front(out.unwritten)
            self.health.failed(now, "write results", out.error)
            return
        self.health.ok()
        for name in _pools(batch) & self.capped:  # their written results freed room
            self.on_freed(name)

    def _refused(
        self, pool: str, lease: Lease, kind: ErrorKind, why: str, was: Ack | Failure
    ) -> None:
        """Fail the job whose write was refused, alone, with a message of fleetd's own."""
        log.error("job %s: the database refused its write: %s", lease.job_id, _said(why))
        retry = None if kind is ErrorKind.PERMANENT or isinstance(was, Ack) else was.retry_delay
        budget = None if isinstance(was, Ack) else was.budget
        message = storable_message(REFUSED + why)
        self.todo.fails.append(
            (pool, Failure(lease, kind, message, retry, was.peak_rss, was.duration, budget))
        )

    def _record_fails(self, outcome: FailOutcome, fails: list[tuple[str, Failure]]) -> None:
        self.counters.lost_leases += len(outcome.lost)
        dead, retried = set(outcome.dead), set(outcome.retried)
        deferred = set(outcome.deferred)
        written = self.monotonic()  # after the write: the store's "now + delay" is earlier
        for pool, f in fails:
            if f.lease.job_id in retried and f.retry_delay is not None:
                later = f.budget.window if f.budget and f.lease.job_id in deferred else 0.0
                at = written + f.retry_delay + later
                heapq.heappush(self.retries_due.setdefault(pool, []), at)
                self.on_retry_due(pool, at)
            claimed = self.failed.pop(f.lease.job_id, None)
            if f.lease.job_id in dead:
                self.counters.dead_letters[(pool, str(f.error_kind))] += 1
                if claimed is not None:
                    log_job(
                        logging.WARNING,
                        "job_dead",
                        claimed,
                        pool,
                        f.duration,
                        f.peak_rss,
                        str(f.error_kind),
                        f.message,
                    )
        if deferred:
            log.warning(
                "retry budget exhausted: %d failed job(s) deferred instead of retried at once",
                len(deferred),
            )


def _pools(results: Results) -> set[str]:
    """The pools with a result in ``results`` (a capped pool's written result frees room)."""
    return {a[0] for a in results.acks} | {p for p, _ in results.fails}


def _said(why: str) -> str:
    """A database's refusal as a log line may say it: it can quote the refused value (a
    handler's text), so it is made storable and cut like a job's message in its log line."""
    return storable_message(why, LOGGED_MESSAGE)


def _ack_refused(why: str) -> str:
    return f"its result could not be stored ({why}); not retried: it would be refused again"


def log_job(
    level: int,
    event: str,
    c: Claimed,
    pool: str,
    duration: float | None,
    peak: int | None,
    error_kind: str | None,
    message: str,
) -> None:
    job_event(
        log,
        level,
        event,
        job_id=c.job_id,
        pool=pool,
        kind=c.kind,
        attempt=c.attempt,
        max_deliveries=c.max_deliveries,
        duration=duration,
        peak_rss=peak,
        error_kind=error_kind,
        message=message,
    )
